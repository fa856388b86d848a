"""Python stacks, every part of them. Imports nothing else of the package, and this ``__init__``
imports nothing: the probe loads ``stacks.sampler`` in the engine process, which must pull in neither
torch nor the analysis (tests/probe/test_stack_sampler.py).

    samples_file     the raw samples file a probe's sampler writes and the sidecar reads (format, checks)
    sampler          ``StackSampler``: one thread's Python stacks by sampling, from a thread of its own (probe side)
    sample_store     what the sampler keeps while it samples, packed into the samples file's object
    threads          every thread's Python stack in a process (snapshot), and a short sampling folded into counts
    sampled          a probe's samples made readable in the sidecar: flame-chart slices and a summary
    weights          how much of the target's time each stack sample stands for
    capture_section  the capture summary's ``python_stacks`` section
    view             ``GET /stacks``: the processes' stacks merged into JSON, text, folded and speedscope
    native           ``GET /stacks?mode=native``: native and Python frames through py-spy
"""
