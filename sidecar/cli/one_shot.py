"""``one_shot()``: the process set-up of a command-line analysis (``sidecar analyze``, ``sidecar diff``).

Such a command is a short process that reads a trace, prints a summary and exits; its start-up and
exit are a large share of what the user waits for (docs/benchmarks.md, issue 13). Three costs in it
buy nothing:

* **Cyclic garbage collection while it runs.** The analyser makes almost no reference cycles (its
  events are ``gc=False`` structs, its columns flat arrays), yet allocation counts trigger about 50
  passes over the objects that imports create (numpy's are most of them). Off for the command.
* **The collections after it.** Re-enabled, the collector's first pass walks every object the
  command made (15 ms, more than a bare interpreter's whole exit), and finalisation collects every
  object left (the modules' functions, classes and dicts, numpy's above all). When the command is
  the process's whole work, its objects are frozen as it ends (``gc.freeze``: moved out of the
  collector's reach), so neither pass has them to walk; the memory goes back to the OS with the
  process anyway. Exit handlers, flushes and module teardown still run.
* **OpenBLAS's thread pool.** numpy's wheels link OpenBLAS, which starts a worker thread per core
  when numpy is imported, lets it spin for work, and joins it at exit. The analyser calls no BLAS
  routine (no ``dot``, ``matmul`` or ``linalg``), so the command runs with
  ``OPENBLAS_NUM_THREADS=1`` (no worker) and the variable is removed again after it. Left alone where
  numpy is already loaded (the library reads the variable once, as it loads) or where the user set
  the variable. The package's modules import numpy only when first used (``sidecar/analysis/__init__.py``), so a
  command's set-up comes before it.

Nothing here changes what the analysis computes.
"""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterator

BLAS_THREADS = "OPENBLAS_NUM_THREADS"


@contextmanager
def one_shot(whole_process: bool) -> Iterator[None]:
    """For the ``with`` block: the cyclic collector off and no BLAS worker threads for a numpy loaded
    inside it (the GC's state and the environment as before after the block, also on an error).
    ``whole_process``: the command is the process's own command line, which ends when it does: its
    objects are frozen as it ends. Not for a call from other code (a test, a program), whose process
    lives on and may hold objects that must be collected to be finalised (nanobind's, in torch's
    Triton, report each one left as a leak)."""
    was_enabled = gc.isenabled()
    gc.disable()
    set_blas = BLAS_THREADS not in os.environ and "numpy" not in sys.modules  # else: the user's, or too late
    if set_blas:
        os.environ[BLAS_THREADS] = "1"
    try:
        yield
    finally:
        if set_blas:
            os.environ.pop(BLAS_THREADS, None)
        if whole_process:
            gc.freeze()
        if was_enabled:
            gc.enable()
