"""The flight recorder's columns: what a probe's rings hold (sidecar/probe/flight_ring.py) and what the
sidecar's view of their dumps reads (sidecar/service/incidents/recorder_view.py), named once for both."""

STEP_FIELDS = ("step", "start_ns", "end_ns", "working", "batch", "tokens", "prefill_tokens",
               "decode_tokens", "running", "waiting")
# A process with CUDA adds these to its step rows: the caching allocator's bytes at the step's end
# (sidecar/probe/gpu_memory.py); a process without CUDA has no such columns.
GPU_MEMORY_FIELDS = ("gpu_allocated", "gpu_reserved")
GC_FIELDS = ("start_ns", "duration_ns", "generation", "collected", "step_thread")
REQUEST_FIELDS = ("arrived_ns", "first_token_ns", "finished_ns", "outcome", "prompt_tokens", "output_tokens")
OUTCOMES = ("finished", "aborted", "error")  # stored as their index
UNKNOWN_OUTCOME = "unknown"  # an outcome outside OUTCOMES, as dumps spell it
