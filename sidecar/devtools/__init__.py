"""Tools for the demo, the tests and the benchmarks, engine-neutral (an engine subclasses ``Stack``).

    stack    an engine's OpenAI-compatible server with its plugin, and the sidecar beside it, as subprocesses
    traffic  a streaming load generator that measures what clients see: TTFT, inter-token gaps, failures
    demo     ``make demo`` for any engine: its server on a local model, the sidecar, traffic, a capture

The small local model they serve is built by ``sidecar make-model`` (sidecar/cli/make_model.py).
"""
