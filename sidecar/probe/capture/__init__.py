"""A probe's capture: torch.profiler's (or Nsight Systems' range), what one process records, where it writes, its own limits.

    profiler          ``StepCapture`` (N working steps), ``WindowCapture`` (the API server's window)
    profiler_options  what torch.profiler records for a capture's spec: the stacks mode, one session per step or not
    nsys              ``NsysCapture`` (backend=nsys): cudaProfilerStart/Stop and NVTX ranges of steps and phases, no trace
    trace_parts       a trace recorded one session per step, its parts joined into one file by byte copies
    trace_root        where a probe writes: only <its root>/captures/<id>/raw/ and <its root>/recorder/
    marker            a probe's marker file on its trace root, and which stale markers it may clear
    limits            what a probe enforces itself: steps, duration, trace bytes
"""
