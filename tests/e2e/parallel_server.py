"""A real vLLM server with more than one engine process of a kind (tensor- or data-parallel ranks),
for the end-to-end tests of ranks and instances: the sidecar and the server started with the tiny
model, every engine process connected before the test begins, all of it closed after the test
whatever happened."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sidecar_vllm.devtools import VllmStack


@contextmanager
def parallel_server(model_dir: Path, work_dir: Path, server_args: tuple[str, ...], processes: int, *,
                    env: dict[str, str] | None = None, server_timeout: float = 240) -> Iterator[VllmStack]:
    """The stack serving ``model_dir`` with ``server_args``, once ``processes`` engine processes
    (API server, engine cores, workers) have connected to its sidecar. ``server_timeout``: how long
    the server may take to answer its health check (a data-parallel start is slower on 2 cores)."""
    stack = VllmStack(model_dir=model_dir, work_dir=work_dir, server_args=server_args, env=dict(env or {}))
    try:
        stack.start(processes=processes, server_timeout=server_timeout)
        yield stack
    finally:
        stack.close()
