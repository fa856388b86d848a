"""The probe channel: every message the sidecar and the probes exchange, as one typed struct each.

JSON text frames over a websocket (``PROBE_WS_PATH``). Each message is an object whose ``type`` tag
names its struct. Turning a frame into a message and back, the validation that rejects a malformed
frame whole, and the protocol version with the reasons for each new one are in
sidecar/common/protocol_codec.py: a change here that a peer of the previous version would misread needs a
new version there. The first frame of a connection is the probe's ``Hello``.

The handshake: each side proves it knows the shared token, and neither sends it (sidecar/common/auth.py has
the HMAC inputs; docs/api.md, "Probe authentication"). The probe connects with no credentials and
sends ``hello`` with a fresh nonce; the sidecar answers ``challenge`` with its own nonce and its proof;
the probe checks that proof before it sends or acts on anything else (wrong: it closes the
connection, says nothing more), then answers ``proof``; the sidecar checks it and only then
registers the probe (wrong: close code ``CLOSE_REFUSED``).

probe → sidecar
  hello      {protocol, process: ProcessIdentity, nonce, files_at?, marker?, step_alarm?}
                                                   ``files_at``: the probe's trace root; ``marker``: the
                                                   name of a file it made in ``<files_at>/probes/``:
                                                   where the sidecar sees it, the two share a file
                                                   system and the sidecar reads the files the probe
                                                   names; else it fetches them (``fetch``);
                                                   ``step_alarm``: it acts on ``step_alarm`` (below)
  proof      {proof}                               HMAC("probe", sidecar nonce, probe nonce)
  heartbeat  {steps, sync_watch?, open_step_ms?, stuck?, in_flight?, slowest_step_ms?, slowest_step?}
                                                   working steps so far; the watch report when changed;
                                                   how long the running step has run; the watchdog's
                                                   report; the requests this process knows in flight;
                                                   the slowest step ended since the last heartbeat.
                                                   Every 2 s, and early (``step_alarm``) when a step
                                                   over the alarm's threshold ended
  capture    {job_id, state, steps_recorded, steps_seen?, step_rate?, first_step?, file?, bytes, stacks,
              stacks_file?, stack_summary?, error?, stop_reason?}
  sync       {job_id, state, steps_recorded, steps_seen?, step_rate?, first_step?, treat_cpu_as_device, sites?,
              error?, stop_reason?}
  modules    {job_id, state, steps_recorded, steps_seen?, step_rate?, first_step?, clock, rows?, hooks_before,
              hooks_after, error?, stop_reason?}   a module-timing job: one row per module with "done"
  memory     {job_id, state, steps_recorded, steps_seen?, step_rate?, first_step?, summary?, file?, bytes,
              entries, error?, stop_reason?}       a memory snapshot: with "done", the probe's JSON summary
                                                   of the allocator's history and the path of the raw
                                                   snapshot (a pickle the sidecar never unpickles)
  answer     {query_id, kind, data?, file?, error?}   the answer to a query (below)
  request_capture          {ask, request_id, steps}  a window process (the API server) asks for a
                                                   capture bound to one request, which waits for the
                                                   answer; ``steps`` is the cap
  request_capture_release  {ask, reason}           the request went on without waiting any longer
                                                   (or was cancelled): stop that ask's capture
  file_chunk {file, offset, size, data, sha256?, error?}
                                                   bytes of a file the sidecar fetched: ``data`` is
                                                   base64; ``size`` the whole file's; ``sha256`` of
                                                   the whole file comes with its last chunk, after
                                                   which the probe deletes the file
  clock_reply  {seq, probe_ns}                     this process's wall clock (``time.time_ns()``)
                                                   when ``clock`` ``seq`` arrived: answered by the
                                                   link thread at once, never the step thread
sidecar → probe
  challenge  {nonce, proof}                        HMAC("sidecar", probe nonce, sidecar nonce)
  arm        {spec: CaptureSpec}    the probe answers ``capture`` state=armed with steps_seen
                                    (``spec.request_id``: a capture bound to a request, below)
  sync_arm   {spec: SyncSpec}       the probe answers ``sync`` state=armed with steps_seen
  module_arm {spec: ModuleSpec}     the probe answers ``modules`` state=armed with steps_seen, where
                                    it knows its model (``ProcessIdentity.extra["model"]``)
  memory_arm {spec: MemorySpec}     the probe answers ``memory`` state=armed with steps_seen; sent only
                                    where ``ProcessIdentity.extra["memory_snapshot"]`` says the probe
                                    knows the job and ``cuda`` that it has a caching allocator to read
  begin      {job_id, start_step}   record from this working step on, the same in every process
  stop       {job_id, reason}       end early, keeping what was recorded
  verdict    {job_id, state, reason?, steps, processes, trace_bytes, trace?, started_by?}
                                    a capture's final state, to its processes still connected;
                                    ``started_by``: the trigger or the alert that started it
  query      {query_id, kind, seconds, hz, only_step_thread}
                                    "recorder": the flight recorder's last ``seconds`` (the probe
                                    writes it to <root>/recorder/<stem>-<query_id>.json and answers
                                    that path: it may be larger than a frame); "stacks": every
                                    thread's Python stack now, or folded samples over ``seconds``;
                                    "requests": the requests in flight this process knows. Answered
                                    from the probe's own threads, never the step thread, so a probe
                                    whose engine is stuck in a step still answers.
  request_capture_answer  {ask, capture_id?, url?, skipped?}
                                    the capture of an ask is armed in every step-driven process
                                    (``capture_id``, its ``url`` path), or why there is none
                                    (``skipped``: another job runs, no engine process, not armed in
                                    time); the request waits for nothing else
  fetch      {file, offset}         send a file this probe wrote and named (a capture's raw trace or
                                    samples, a recorder dump) from ``offset``: one ``file_chunk`` of
                                    at most ``CHUNK_BYTES``; only files under the probe's own root
  clock      {seq}                  a clock probe: the sidecar notes its own wall clock when sending
                                    and when the reply arrives, and estimates this process's clock
                                    offset from the fastest round trips, as NTP does (service/clock_sync.py)
  step_alarm {threshold_ms?}        the lowest threshold of the sidecar's single-event step rules
                                    (none: null): the probe's link thread looks at its step ring
                                    every 0.1 s and sends a heartbeat at once when a step longer
                                    than that ended (at most one early every 0.2 s), so a rule
                                    fires within a second of the step's end, not at the next beat.
                                    Sent after the handshake when there is one, and on every
                                    change, to a probe whose hello says ``step_alarm``; a probe
                                    forgets it when its link drops

Job ids are unique across kinds (a scan's starts with ``s``), so ``begin`` and ``stop`` serve both.
An id is never a path component such as ``..`` (``JobId``). A capture names no directory: each probe
writes ``<its trace root>/captures/<job id>/raw/<process file stem>.json`` and reports that path;
with sampled stacks, its raw samples beside it (``<stem>.stacks.msgpack``, sidecar/stacks/samples_file.py).

A capture bound to a request (``CaptureSpec.request_id``) begins at once in each step-driven probe,
from its own step count when it is armed: the request waits for every "armed" before its first step,
so that step is recorded; the sidecar's ``begin`` (the highest of the counts, no lead) only aligns the
processes further when it arrives before their first step. It ends after ``steps`` working steps or
when the request does (``REQUEST_ENDED``: the engine integration ends it on each step thread).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

import msgspec

PROBE_WS_PATH = "/probe/ws"
PROBE_MARKERS_DIR = "probes"  # <trace root>/probes/<hello.marker>: a probe's marker (sidecar/probe/capture/trace_root.py)
RECORDER_DIR = "recorder"  # <trace root>/recorder/<recorder_dump_name(...)>: a recorder dump
# Private-use websocket close code: the sidecar refuses this probe (bad hello, other protocol
# version, a wrong proof); the close frame's reason says why.
CLOSE_REFUSED = 4400
METRICS_PUSH_PATH = "/v1/metrics"  # probes push OTLP/HTTP metrics here (sidecar/service/routes/metrics.py)

Count = Annotated[int, msgspec.Meta(ge=0)]
Steps = Annotated[int, msgspec.Meta(ge=1)]
# Captures "YYYYmmdd-HHMMSS-xxxxxx", scans "s" + the same: never ".." nor any other path component.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z"
JobId = Annotated[str, msgspec.Meta(pattern=JOB_ID_PATTERN)]
Hex64 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]  # a nonce (32 random bytes) or an HMAC-SHA256
ROLE_PATTERN = r"^[a-z][a-z0-9_]{0,31}\Z"  # a role's name: on the wire, in processes=, in file names
RoleName = Annotated[str, msgspec.Meta(pattern=ROLE_PATTERN)]
MAX_TEXT = 4096
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
ProbeId = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{0,32}\Z")]  # ProcessIdentity.probe_id
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
HOST_CHARS = 48  # a host name in a file name, at most


def file_name_part(host: str) -> str:
    """A host name as part of a file name: letters, digits, ``_.-`` (anything else: ``_``), at most
    ``HOST_CHARS``; ``host`` if nothing is left."""
    return _UNSAFE_IN_NAME.sub("_", host)[:HOST_CHARS].strip("._") or "host"
MAX_REQUEST_ID = 512  # an engine's request id may hold a client's X-Request-Id: longer ones are cut
RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID)]
AskId = Annotated[int, msgspec.Meta(ge=1, le=2**53)]
# The stop reason of a request-scoped capture that ended with its request (not its step cap): the
# probes report it, and the sidecar judges such a capture complete (captures.py).
REQUEST_ENDED = "the request ended"
Activity = Literal["cpu", "cuda"]
# Python stacks in a capture (docs/api.md, "Python stacks"): "sampled" reads the step thread's stack
# from a thread of the probe's own (sidecar/stacks/sampler.py); "traced" is torch.profiler's
# with_stack, applied only in roles whose ``Role.traced_stacks`` says it is affordable, sampled in
# the others. A report's ``stacks`` says what that process recorded.
StackMode = Literal["none", "sampled", "traced"]
# What records a capture: torch.profiler (a trace file per process), or Nsight Systems, which runs the
# engine and records between the probes' cudaProfilerStart and cudaProfilerStop (sidecar/probe/capture/nsys.py).
CaptureBackend = Literal["torch", "nsys"]
MAX_STACK_HZ = 5000.0
StackHz = Annotated[float, msgspec.Meta(ge=1.0, le=MAX_STACK_HZ)]
DEFAULT_STACK_HZ = 1000.0

# Per-process states a probe reports. A capture records ("capturing") then writes its file
# ("exporting"); a scan records ("scanning") and reports its sites with "done".
P_ARMED, P_CAPTURING, P_SCANNING, P_EXPORTING, P_DONE, P_FAILED = (
    "armed", "capturing", "scanning", "exporting", "done", "failed")
CaptureState = Literal["armed", "capturing", "exporting", "done", "failed"]
ScanState = Literal["armed", "scanning", "done", "failed"]


# -- what a probe is -----------------------------------------------------------------------------------
class ProcessIdentity(msgspec.Struct, frozen=True, kw_only=True):
    role: RoleName
    role_label: Text  # "engine core": the engine profile's name for the role
    step_driven: bool
    pid: Annotated[int, msgspec.Meta(ge=1)]
    rank: Count | None = None
    host: Text = ""
    cuda: bool = False
    engine: Text = ""  # "vllm 0.32.0"
    # The engine instance (one server; one data-parallel engine core and its workers): processes of
    # one instance count the same working steps. "": the only one, unnamed.
    instance: Text = ""
    extra: dict[str, Union[str, int, float, bool, None]] = {}
    # Drawn by the probe when it starts: the names of the files it writes carry it (``probe_file_stem``),
    # so two processes of one role, rank, pid and host name writing to one disk (two containers
    # sharing a volume) never write one file. "": an identity no probe drew one for (an older probe).
    probe_id: ProbeId = ""

    @property
    def label(self) -> str:
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"{self.role_label}{rank} (pid {self.pid})"

    @property
    def file_stem(self) -> str:
        rank = f"-rank{self.rank}" if self.rank is not None else ""
        return f"{self.role}{rank}-pid{self.pid}"

    @property
    def probe_file_stem(self) -> str:
        """The stem of the files this process's probe writes (raw traces, samples, recorder dumps):
        ``file_stem``, the host and the probe id, ``worker-rank0-pid7-node-2-p3fa9c01b``. The
        capture's own files keep ``file_stem`` (sidecar/service/export/process_stems.py)."""
        if not self.probe_id:
            return self.file_stem
        return f"{self.file_stem}-{file_name_part(self.host)}-p{self.probe_id}"

    @property
    def sort_key(self) -> tuple:
        """Listing and merged-trace order: window processes first, then unranked step-driven
        processes (an engine core), then ranked ones by rank."""
        return (self.step_driven, self.rank is not None, self.rank or 0, self.role, self.pid)


# -- what a job asks of a probe ------------------------------------------------------------------------
class CaptureSpec(msgspec.Struct, frozen=True, kw_only=True):
    """No directory: a probe writes only under its own trace root (``<root>/captures/<id>/raw/``)."""

    id: JobId
    steps: Steps
    activities: tuple[Activity, ...] = ()  # empty: what the host has
    record_shapes: bool = False
    stacks: StackMode = "none"
    stack_hz: StackHz = DEFAULT_STACK_HZ
    profile_memory: bool = False
    with_flops: bool = False
    # torch.profiler's module hierarchy: ``nn.Module: <Class>_<n>`` ranges around every module's
    # forward. torch writes them only with its Python tracer, so a process that honours it records
    # traced stacks too (sidecar/probe/capture/profiler.py, ``module_mode``).
    with_modules: bool = False
    # The request this capture is bound to (a request-scoped capture); None: any other capture.
    request_id: RequestId | None = None
    backend: CaptureBackend = "torch"


class SyncSpec(msgspec.Struct, frozen=True, kw_only=True):
    id: JobId
    steps: Steps


# The memory snapshot's bounds: the allocator's history is a ring of at most this many entries (each
# a few KB with its Python stack), and the raw snapshot file at most this many bytes.
DEFAULT_MEMORY_ENTRIES = 100_000
MAX_MEMORY_ENTRIES = 1_000_000
DEFAULT_MEMORY_FILE_BYTES = 256 * 2**20


class ModuleSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Time every ``nn.Module`` of this process's model for ``steps`` working steps (forward hooks)."""

    id: JobId
    steps: Steps


class MemorySpec(msgspec.Struct, frozen=True, kw_only=True):
    """Record the CUDA caching allocator's history for ``steps`` working steps, at most ``max_entries``
    alloc/free events (``torch.cuda.memory._record_memory_history``), then snapshot it; a raw snapshot
    file over ``max_bytes`` is not kept (the summary is)."""

    id: JobId
    steps: Steps
    max_entries: Annotated[int, msgspec.Meta(ge=1, le=MAX_MEMORY_ENTRIES)] = DEFAULT_MEMORY_ENTRIES
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_MEMORY_FILE_BYTES


# A probe that knows the memory-snapshot job says so in its identity's extra (the sidecar sends
# ``memory_arm`` only there: an older probe never gets a frame it does not know).
MEMORY_EXTRA = "memory_snapshot"
P_RECORDING = "recording"  # a memory snapshot's process state while the allocator records its history
MemoryState = Literal["armed", "recording", "done", "failed"]


# A process whose engine integration told its probe where the model is (``ProcessIdentity.extra``):
# the module-timing job runs there, and only there.
MODEL_EXTRA = "model"
P_TIMING = "timing"  # a module-timing job's process state while its hooks are in
ModuleState = Literal["armed", "timing", "done", "failed"]
MAX_MODULE_ROWS = 20000  # one row per module of the model: far beyond any model's count


class ModuleRow(msgspec.Struct, frozen=True, kw_only=True):
    """One module of the model, over the job's steps: its path (``named_modules``' name, "" for the
    model itself), its class, how often it ran, and its time with and without the modules inside it."""

    path: Text
    type: Text
    calls: Count
    total_ns: Count
    self_ns: Count
    outer_ns: Count = 0  # of total_ns, the calls with no timed module around them (the forward's)


# -- messages ------------------------------------------------------------------------------------------
class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


# "<pid>-<random>-<pid space>-<host>" (sidecar/probe/capture/marker.py, which reads its groups), or none
MARKER_PATTERN = rf"^(?:([0-9]{{1,10}})-([0-9a-f]{{32}})-([0-9a-f]{{16}})-([A-Za-z0-9_.-]{{1,{HOST_CHARS}}}))?\Z"
Marker = Annotated[str, msgspec.Meta(pattern=MARKER_PATTERN)]
CHUNK_BYTES = 512 * 1024  # base64 makes it about 700 KB: under the channel's 1 MiB frame limit


class Hello(_Message, tag="hello", kw_only=True):
    protocol: int
    process: ProcessIdentity
    nonce: Hex64  # fresh for each connection
    files_at: Text = ""  # the probe's trace root (absolute)
    marker: Marker = ""  # a file in <files_at>/probes/ (none: the probe asks to have its files fetched)
    # It acts on ``StepAlarm`` (a step ring to watch): the sidecar sends that frame only where this
    # says so, so a probe that does not know the frame never gets it (protocol_codec.py, issue 30).
    step_alarm: bool = False


class Challenge(_Message, tag="challenge", kw_only=True):
    nonce: Hex64  # the sidecar's, fresh for each connection
    proof: Hex64  # auth.sidecar_proof(token, hello.nonce, nonce)


class Proof(_Message, tag="proof", kw_only=True):
    proof: Hex64  # auth.probe_proof(token, challenge.nonce, hello.nonce)


class InFlight(msgspec.Struct, frozen=True, kw_only=True):
    """What a process that knows the engine's requests (the engine core) says of them at a heartbeat."""

    count: Count
    oldest_arrival_ns: Count | None = None  # unix ns; None with no request in flight


class Heartbeat(_Message, tag="heartbeat", kw_only=True):
    steps: Count
    sync_watch: dict[str, Any] | None = None
    # How long the step running now has run (ms); None between steps. A step-driven process only.
    open_step_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # The watchdog fired for the running step (SIDECAR_WATCHDOG_S): {"since_ns", "step", "frames"}.
    stuck: dict[str, Any] | None = None
    in_flight: InFlight | None = None
    # The slowest step that ended since the previous heartbeat (ms, its step number); None when no step
    # ended. A rule on one slow step (the sidecar's triggers) sees each step once, whatever its length.
    slowest_step_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    slowest_step: Count | None = None


class _JobReport(_Message, kw_only=True):
    job_id: JobId
    steps_recorded: Count = 0
    steps_seen: Count | None = None  # with "armed": the process's working-step count
    # With "armed": its working steps per second over its last 2 s (None: too few steps), which the
    # sidecar's begin lead uses before its own heartbeats have measured a rate.
    step_rate: Annotated[float, msgspec.Meta(ge=0)] | None = None
    first_step: Count | None = None  # the working step recording started at
    error: Text | None = None
    stop_reason: Text | None = None
    # With "done", a job that cannot see inside a replayed CUDA graph (module timing, a sync scan):
    # the steps of its window in which the engine replayed one, and the replays (sidecar/common/cuda_graphs.py).
    graph_steps: Count = 0
    graph_replays: Count = 0


class CaptureReport(_JobReport, tag="capture", kw_only=True):
    state: CaptureState
    file: Text | None = None  # with "done": the raw trace the probe wrote
    bytes: Count = 0
    stacks: StackMode = "none"  # what this process recorded (may differ from what was asked)
    # ms the profiler's start/step/stop calls took on the engine's step thread (the API server: its
    # event loop) so far; with "done", how long writing the file took on the probe's export thread.
    step_thread_ms: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    export_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # With "done" and sampled stacks: the raw samples file beside ``file`` (sidecar/stacks/samples_file.py),
    # from which the sidecar builds the stacks' slices and summary.
    stacks_file: Text | None = None
    # With "done" and sampled stacks whose samples could not be saved: {"samples", "error"} (why the
    # stacks are lost; the trace is not). The sidecar's summary of a samples file takes this place.
    stack_summary: dict[str, Any] | None = None
    # An nsys capture (backend "nsys"): {"cuda_profiler": whether this process called
    # cudaProfilerStart/Stop, "step_ranges": NVTX step ranges pushed, "phase_ranges": whether its phases
    # had NVTX ranges, "phase_note": why not}; None: a torch.profiler capture.
    nsys: dict[str, Any] | None = None


class SyncReport(_JobReport, tag="sync", kw_only=True):
    state: ScanState
    treat_cpu_as_device: bool = False
    sites: list[dict[str, Any]] | None = None  # with "done" (sidecar.syncs.report)


class ModuleReport(_JobReport, tag="modules", kw_only=True):
    state: ModuleState
    clock: Literal["cuda", "cpu"] = "cpu"  # what timed the modules: device events, or the host clock
    rows: Annotated[list[ModuleRow], msgspec.Meta(max_length=MAX_MODULE_ROWS)] | None = None  # with "done"
    # Forward hooks on the model before the job and after it removed its own: equal when it left nothing.
    hooks_before: Count = 0
    hooks_after: Count = 0


class MemoryReport(_JobReport, tag="memory", kw_only=True):
    state: MemoryState
    # With "done": the probe's summary of its snapshot (sidecar/probe/memory_summary.py); its size is
    # bounded there (fixed top-K tables, a series of at most a few hundred points).
    summary: dict[str, Any] | None = None
    file: Text | None = None  # with "done": the raw snapshot the probe wrote (None: not kept, see summary)
    bytes: Count = 0
    entries: Count = 0  # alloc/free events in the history the snapshot holds


class Arm(_Message, tag="arm", kw_only=True):
    spec: CaptureSpec


class SyncArm(_Message, tag="sync_arm", kw_only=True):
    spec: SyncSpec


class ModuleArm(_Message, tag="module_arm", kw_only=True):
    spec: ModuleSpec


class MemoryArm(_Message, tag="memory_arm", kw_only=True):
    spec: MemorySpec


class Begin(_Message, tag="begin", kw_only=True):
    job_id: JobId
    start_step: Count


class Stop(_Message, tag="stop", kw_only=True):
    job_id: JobId
    reason: Text = "stopped"


MAX_ALERT_LABELS = 64


class StartedBy(msgspec.Struct, frozen=True, kw_only=True):
    """What started a capture that no client asked for (the API server's capture span names it): a
    trigger's firing (``id``: the trigger's) or an Alertmanager alert (``id``: its fingerprint, with
    its ``startsAt`` and labels)."""

    kind: Literal["trigger", "alert"]
    name: Text
    id: Text
    starts_at: Text | None = None
    labels: Annotated[dict[Text, Text], msgspec.Meta(max_length=MAX_ALERT_LABELS)] = msgspec.field(default_factory=dict)


class Verdict(_Message, tag="verdict", kw_only=True):
    """A capture's final state, sent to each of its processes still connected when it ends: the API
    server's capture span needs it, and the probe channel is authenticated both ways, so nothing
    has to send the token to the sidecar's HTTP API to read it (issue 10)."""

    job_id: JobId
    state: Literal["done", "partial", "failed", "cancelled"]
    reason: Text | None = None
    steps: Count = 0  # the fewest working steps a step-driven process recorded
    processes: Count = 0
    trace_bytes: Count = 0
    trace: Text | None = None  # the merged trace's path on the sidecar: /profile/<id>/trace
    started_by: StartedBy | None = None  # None: a client started it


QueryKind = Literal["recorder", "stacks", "requests"]
QueryId = Annotated[int, msgspec.Meta(ge=1, le=2**53)]
MAX_QUERY_SECONDS = 3600.0
MAX_SAMPLE_SECONDS = 60.0


class Query(_Message, tag="query", kw_only=True):
    query_id: QueryId
    kind: QueryKind
    # recorder: how far back (0: all it holds); stacks: how long to sample (0: one snapshot)
    seconds: Annotated[float, msgspec.Meta(ge=0, le=MAX_QUERY_SECONDS)] = 0.0
    hz: Annotated[float, msgspec.Meta(ge=1, le=1000)] = 100.0  # stacks sampling rate
    only_step_thread: bool = False  # stacks sampling: the step thread alone
    # recorder: only the rows ending at or after this time (unix ns, the probe's clock; 0: none): the
    # home page's refreshes ask for what is new since their last read. Optional: a probe that predates
    # it ignores it and sends its last ``seconds``, which the sidecar cuts the same way.
    since_ns: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    # recorder: each ring's rows as the ring holds them, written as msgpack (sidecar/common/packed_rows.py),
    # which the sidecar turns into columns and cuts: none of that work in the engine's process. A probe
    # that predates it ignores it and writes JSON, which the sidecar reads as before.
    packed: bool = False


def recorder_dump_name(probe_file_stem: str, query_id: int, packed: bool = False) -> str:
    """The name of a recorder query's dump under ``RECORDER_DIR``: ``<stem>-q<id>.json``, or
    ``.msgpack`` when the query asked for packed rows (``Query.packed``)."""
    return f"{probe_file_stem}-q{int(query_id)}{'.msgpack' if packed else '.json'}"


class Answer(_Message, tag="answer", kw_only=True):
    query_id: QueryId
    kind: QueryKind
    data: dict[str, Any] | None = None  # stacks, requests: inline
    file: Text | None = None  # recorder: the dump the probe wrote under its trace root
    error: Text | None = None


class RequestCapture(_Message, tag="request_capture", kw_only=True):
    """Capture the steps of this request, at most ``steps`` (a window process asks: the API server,
    whose request waits for the answer)."""

    ask: AskId  # unique per probe connection; the answer and a release name it
    request_id: RequestId
    steps: Steps


class RequestCaptureAnswer(_Message, tag="request_capture_answer", kw_only=True):
    """The capture is armed in every step-driven process (``capture_id``), or why not (``skipped``)."""

    ask: AskId
    capture_id: JobId | None = None
    url: Text | None = None  # the capture's path on the sidecar's HTTP API: /profile/<id>
    skipped: Text | None = None


class RequestCaptureRelease(_Message, tag="request_capture_release", kw_only=True):
    """The request no longer waits for this ask (it gave up, or was cancelled): its capture, if one
    was started, is stopped."""

    ask: AskId
    reason: Text = "released"


ClockSeq = Annotated[int, msgspec.Meta(ge=1, le=2**53)]


class Fetch(_Message, tag="fetch", kw_only=True):
    file: Text  # as the probe named it in a report or an answer
    offset: Count = 0


class FileChunk(_Message, tag="file_chunk", kw_only=True):
    file: Text
    offset: Count
    size: Count = 0  # the whole file's
    data: Annotated[str, msgspec.Meta(max_length=(CHUNK_BYTES + 2) // 3 * 4)] = ""  # base64
    sha256: Hex64 | None = None  # with the last chunk: of the whole file
    error: Text | None = None  # the file cannot be sent (none such, not this probe's, unreadable)


class ClockProbe(_Message, tag="clock", kw_only=True):
    """Reply at once with the wall clock: one sample of this process's clock offset."""

    seq: ClockSeq  # unique per connection: the reply names it


class ClockReply(_Message, tag="clock_reply", kw_only=True):
    seq: ClockSeq
    probe_ns: Count  # time.time_ns() in the probe's process when the ``clock`` message was taken


class StepAlarm(_Message, tag="step_alarm", kw_only=True):
    """Report a step longer than ``threshold_ms`` as soon as it ends: a heartbeat sent then, not at the
    next beat (sidecar/probe/heartbeat.py, ``HeartbeatSource.early``). The lowest threshold of the
    sidecar's single-event step rules; None: no such rule, no early heartbeats."""

    threshold_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None


FromProbe = Union[Hello, Proof, Heartbeat, CaptureReport, SyncReport, ModuleReport, MemoryReport, Answer, RequestCapture, RequestCaptureRelease,
                  ClockReply, FileChunk]
FromSidecar = Union[Challenge, Arm, SyncArm, Begin, Stop, Verdict, Query, RequestCaptureAnswer, ClockProbe, Fetch,
                    ModuleArm, StepAlarm, MemoryArm]
JobReport = Union[CaptureReport, SyncReport, ModuleReport, MemoryReport]
