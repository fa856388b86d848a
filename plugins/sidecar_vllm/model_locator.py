"""Where a vLLM worker's model is: worker → model runner → model (the probe's module-timing job).

Read when a job begins, not when the worker is built: vLLM creates the model runner in
``init_device`` and loads the model later (``load_model``). ``get_model()`` unwraps a CUDA-graph
wrapper to the model itself, whose modules are the ones to hook.
"""

from __future__ import annotations

from typing import Any


def worker_model(worker: Any) -> Any:
    """The worker's model, or None while it has none yet."""
    runner = getattr(worker, "model_runner", None)
    if runner is None or getattr(runner, "model", None) is None:
        return None
    try:
        return runner.get_model()
    except Exception:  # "Cannot get model before model has been initialized", or a runner without it
        return getattr(runner, "model", None)
