"""The engine-side half: one probe per engine process records steps on request of the sidecar.
See probe.Probe; its torch.profiler capture is capture/.

    probe            the per-process probe: ``step_begin``/``step_end`` on the step path, message dispatch
    link             the websocket to the sidecar: a daemon thread with its own loop, the handshake (the
                     sidecar proves the token first), typed messages, reconnecting
    heartbeat        what each heartbeat says (step count, sync watch, slowest and stuck step, requests in flight),
                     and when one goes early: a step over the sidecar's step alarm just ended
    queries          answers to the sidecar's queries (flight recorder, stacks, requests), off the step thread
    watchdog         a step that runs too long: reported stuck, stacks dumped once
    flight_ring      the flight recorder's rings (steps, GC pauses, finished requests), in fixed memory
    gpu_memory       the CUDA allocator's bytes for the step rows: read at each step's end where that costs
                     at most 1 µs, else sampled by a thread of its own
    file_sender      a file the sidecar fetches over the channel (another host), in chunks, then deleted
    sync_tools       the hidden-sync scan and watch, built from the engine profile
    modules_job      the module-timing job in one process: hooks in and out on the step thread
    modules_timer    ``ModuleTimer``: every ``nn.Module`` of a model timed with forward hooks
    memory_job       the memory-snapshot job in one process: the CUDA allocator's history over N steps
    memory_summary   an allocator snapshot made into a small JSON summary (peak, sites, fragmentation, steps)
    profile_header   which requests ask to be captured (X-Sidecar-Profile, baggage sidecar.profile)
    request_capture  asking the sidecar for a request's capture from the API server's event loop
"""

from .probe import Probe

__all__ = ["Probe"]
