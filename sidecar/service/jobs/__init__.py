"""The one job life cycle and its three kinds: captures, sync scans, module timings (no aiohttp).

    model             kinds, ids, errors, the per-process record, the verdict
    states            the states of a job and of each process in it, and which moves are allowed
    manager           ``JobManager``: the life cycle every kind shares (arm → begin → record → verdict → retention)
    board             ``JobBoard``: one job at a time across kinds; the probes' reports routed by job id
    arming            the common start step: the one place where ``delay`` applies
    params            the start and query parameters validated: every bad value a ``ParamError`` naming it
    capture           the capture model: ``Capture``, ``CaptureProcess``, ``BoundCaptureRequest``, ``capture_url``, its JSON
    captures          ``CaptureManager``: what only a capture does (out dir, API-server window, merge, capture.json)
    capture_index     the captures an earlier run left on disk, rebuilt at start
    scans             ``ScanManager``: hidden-sync scans (baseline, merged report)
    modules           ``ModuleManager``: the module-timing job
    memory            ``MemoryManager``: memory snapshots (the CUDA allocator's history; raw snapshots kept)
    request_captures  a request's ask for a capture becomes a capture bound to it
    saved             what a saved job gives back after a restart (a scan or a module timing: one JSON file)
    storing           a finished job handed to the object store: what is uploaded, its key, the job's ``stored``
    stored_captures   the captures only the object store holds: listed, served, fetched back on demand
"""
