"""The engine-side half: records steps on request of the sidecar. See probe.Probe.

probe.py     the per-process probe, on the engine's step path
recorder.py  torch.profiler captures: ``StepCapture`` (N working steps), ``WindowCapture`` (API server)
sync_tools.py  the hidden-sync scan and watch, built from the engine profile
link.py      the websocket to the sidecar (the handshake: the sidecar proves the token first; typed
             messages, reconnecting)
trace_root.py  where a probe writes: only <its root>/captures/<id>/raw/ and <its root>/recorder/
limits.py    the probe's own limits on steps, duration and trace bytes
queries.py   answers to the sidecar's queries (flight recorder, stacks, requests), off the step thread
watchdog.py  a step that runs too long: reported stuck, stacks dumped once
profile_header.py  which requests ask to be captured (X-Sidecar-Profile, baggage sidecar.profile)
request_capture.py  asking the sidecar for a request's capture from the API server's event loop
"""

from .probe import Probe

__all__ = ["Probe"]
