"""``one_shot()``: a command-line analysis runs without the cyclic GC, imports numpy without BLAS
worker threads, and leaves the process (GC state, environment) as it found it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sidecar.cli.one_shot import BLAS_THREADS, one_shot

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (numpy not yet imported); its stdout."""
    environ = {k: v for k, v in os.environ.items() if k != BLAS_THREADS}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("enabled_before", [True, False])
def test_gc_off_inside_and_as_before_after(enabled_before):
    was = gc.isenabled()
    try:
        gc.enable() if enabled_before else gc.disable()
        with one_shot(whole_process=False):
            assert not gc.isenabled()
        assert gc.isenabled() is enabled_before
        with pytest.raises(RuntimeError):
            with one_shot(whole_process=False):
                raise RuntimeError("the command failed")
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable() if was else gc.disable()


# Records the BLAS variable as it is at the moment numpy's package starts to load.
_WATCH_NUMPY_IMPORT = """
import importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))
        return None
sys.meta_path.insert(0, Watch())
"""


def test_numpy_loads_with_one_blas_thread_and_the_environment_is_restored():
    out = _python(_WATCH_NUMPY_IMPORT + """
from sidecar.cli.one_shot import one_shot
with one_shot(whole_process=False):
    import numpy
print(seen, os.environ.get("OPENBLAS_NUM_THREADS"))
""")
    assert out.split() == ["['1']", "None"], "numpy saw the variable set to 1, nothing saw it after"


def test_sidecar_analyze_loads_numpy_inside_its_set_up():
    """The command's modules up to ``run`` import no numpy (the package's names are loaded on first
    use), so the set-up comes first."""
    from .conftest import trace_path

    out = _python(_WATCH_NUMPY_IMPORT + f"""
import gc, io, contextlib
from sidecar.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["analyze", {str(trace_path("cpu-only-tiny.json.gz"))!r}, "--json"])
print(code, seen, os.environ.get("OPENBLAS_NUM_THREADS"), gc.isenabled())
""")
    assert out.split() == ["0", "['1']", "None", "True"]


def test_a_users_own_blas_setting_is_left_alone():
    out = _python(_WATCH_NUMPY_IMPORT + """
from sidecar.cli.one_shot import one_shot
with one_shot(whole_process=False):
    import numpy
print(seen, os.environ.get("OPENBLAS_NUM_THREADS"))
""", OPENBLAS_NUM_THREADS="3")
    assert out.split() == ["['3']", "3"]


# Counts gc.freeze calls; at exit, says whether objects are frozen and how many collections ran.
_WATCH_FREEZE = """
import atexit, gc
calls = []
freeze = gc.freeze
gc.freeze = lambda: (calls.append(1), freeze())
atexit.register(lambda: print(len(calls), gc.get_freeze_count() > 0))
"""


@pytest.mark.parametrize(("commands", "whole_process", "expected"), [
    (2, True, ["2", "True"]),  # the process's own commands: each one's objects frozen as it ends
    (2, False, ["0", "False"]),  # called from other code: the process exits as it would have
    (0, True, ["0", "False"]),
])
def test_frozen_only_for_the_process_own_command(commands, whole_process, expected):
    code = _WATCH_FREEZE + f"""
from sidecar.cli.one_shot import one_shot
for _ in range({commands}):
    with one_shot(whole_process={whole_process}):
        pass
"""
    assert _python(code).split() == expected


def test_the_command_line_is_the_process_own_but_a_call_to_main_is_not():
    from .conftest import trace_path

    path = str(trace_path("cpu-only-tiny.json.gz"))
    as_run = _python(_WATCH_FREEZE + f"""
import io, runpy, sys, contextlib
sys.argv = ["sidecar", "analyze", {path!r}, "--json"]  # as `python -m sidecar.cli analyze ...` starts
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    runpy.run_module("sidecar.cli", run_name="__main__", alter_sys=True)
""")
    called = _python(_WATCH_FREEZE + f"""
import io, contextlib
from sidecar.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["analyze", {path!r}, "--json"])
""")
    assert (as_run.split(), called.split()) == (["1", "True"], ["0", "False"])


def test_no_collection_walks_the_command_objects_after_it():
    """Re-enabled after a command of the process's own, the collector's young generation holds
    nothing the command made (the pass over them took 15 ms on the largest shared trace)."""
    out = _python("""
import gc
from sidecar.cli.one_shot import one_shot
with one_shot(whole_process=True):
    made = [[i] for i in range(5000)]  # tracked objects, as a command makes them
print(gc.get_count()[0] < 1000, gc.isenabled())
""")
    assert out.split() == ["True", "True"]


def test_analyze_json_is_unchanged_by_the_set_up(tmp_path):
    """The command's output with one_shot is the summary analyze_path computes in this process."""
    import json

    from sidecar.analysis import analyze_path

    from .conftest import trace_path

    path = str(trace_path("a100-cuda-event-sync.json.gz"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    done = subprocess.run([sys.executable, "-m", "sidecar.cli", "analyze", path, "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(analyze_path(path)))
