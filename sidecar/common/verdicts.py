"""A job's verdict as the HTTP API reports it (docs/api.md): the final states of a capture or scan.

Apart from sidecar/service so that the client and the engine's capture spans read the same words
without importing the sidecar service.
"""

DONE, PARTIAL, FAILED = "done", "partial", "failed"
# Stopped by its user before any step-driven process recorded a step: nothing to judge, no trace.
CANCELLED = "cancelled"
FINAL = (DONE, PARTIAL, FAILED, CANCELLED)
