"""The ground floor: what every side shares. Imports nothing else of the package.

    auth             the shared token and the HMAC proofs of it (probe handshake, signed metric pushes)
    config           environment variables and defaults, one constant each; the one boolean parser
    cuda_graphs      CUDA graph replays counted while a job's window is open (what module timing and scans cannot see into)
    phases           a step's engine-neutral phases, ``PhaseRange``, the trace member that names a capture's ranges
    protocol         the probe channel: every message the sidecar and the probes exchange, one typed struct each
    protocol_codec   a frame to and from its message, validated whole; ``PROTOCOL_VERSION``
    recorder_fields  the flight recorder's columns, named once for the probe's rings and the sidecar's view
    step_window      the step window of a job in one step-driven process: which working steps it records
    verdicts         a job's verdict as the HTTP API reports it (sidecar, client, capture spans)
    version          the package's ``__version__``
"""
