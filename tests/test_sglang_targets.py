"""The SGLang plugin's hook targets exist, as the hooks use them, in every supported SGLang release.

Reads the released wheels' source with ``ast`` (no SGLang import: the project venv has no SGLang, and
importing it needs a CUDA or a special CPU install). The wheels are downloaded once with
``pip download --no-deps`` into .cache/sglang-wheels/ (git-ignored) and read in memory.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sidecar_sglang import hooks
from sidecar_sglang.profile import ALLOW_ENTRIES, PHASE_RULES, SGLANG_PROFILE, SUPPORTED_VERSIONS

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "sglang-wheels"


class Source:
    """The ``sglang/`` package of one wheel: file paths and parsed modules."""

    def __init__(self, wheel: Path) -> None:
        with zipfile.ZipFile(io.BytesIO(wheel.read_bytes())) as zf:
            self.files = {n: zf.read(n) for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")}
        self._trees: dict[str, ast.Module] = {}

    def module(self, dotted: str) -> ast.Module:
        path = dotted.replace(".", "/") + ".py"
        if path not in self.files:  # a package: its __init__
            path = dotted.replace(".", "/") + "/__init__.py"
        if path not in self.files:
            raise AssertionError(f"no module {dotted}")
        if path not in self._trees:
            self._trees[path] = ast.parse(self.files[path])
        return self._trees[path]

    def cls(self, dotted: str, name: str) -> ast.ClassDef:
        for node in self.module(dotted).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise AssertionError(f"no class {dotted}.{name}")


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]


def self_attributes_set(cls: ast.ClassDef) -> set[str]:
    """Attributes assigned as ``self.x = ...`` / ``self.x: T = ...`` in any method of ``cls``."""
    names = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
    return names


def class_fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def self_calls(fn: ast.FunctionDef) -> list[str]:
    return [n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]


def _wheel(version: str) -> Path:
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"sglang=={version}",
                           "-d", str(CACHE)], capture_output=True, text=True, timeout=900)
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if done.returncode or not found:
        pytest.fail(f"pip download sglang=={version} failed (rc {done.returncode}): {done.stderr[-2000:]}")
    return found[0]


@pytest.fixture(scope="session")
def sglang_sources() -> dict[str, Source]:
    return {v: Source(_wheel(v)) for v in SUPPORTED_VERSIONS}


@pytest.fixture(params=SUPPORTED_VERSIONS)
def src(request, sglang_sources) -> Source:
    return sglang_sources[request.param]


def test_patch_table_names_existing_methods(src):
    for module, class_name, attr, _ in hooks.PATCHES:
        assert attr in methods(src.cls(module, class_name)), f"{module}.{class_name}.{attr}"


def test_scheduler_step_boundaries(src):
    scheduler = src.cls(hooks.SCHEDULER_MODULE, "Scheduler")
    m = methods(scheduler)
    assert params(m["get_next_batch_to_run"]) == ["self", "running_batch", "last_batch"]
    ingest = m["ingest_requests"]  # called by the loops with no arguments: all but self have defaults
    assert params(ingest)[0] == "self" and len(ingest.args.defaults) == len(ingest.args.args) - 1
    # Each loop iteration calls both once: the step begins at one and ends at the other.
    for loop in ("event_loop_normal", "event_loop_overlap"):
        calls = self_calls(m[loop])
        assert calls.count("ingest_requests") == 1 and calls.count("get_next_batch_to_run") == 1, loop
        assert calls.index("ingest_requests") < calls.index("get_next_batch_to_run"), loop
    # What _has_work and _end_step read on the scheduler.
    assert {"waiting_queue", "running_batch", "last_batch", "chunked_req"} <= self_attributes_set(scheduler)
    # SGLang loads plugins in the scheduler process before it builds the Scheduler.
    run = next(n for n in src.module(hooks.SCHEDULER_MODULE).body
               if isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process")
    called = [n.func.id for n in ast.walk(run) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "load_plugins" in called


def test_plan_and_batch_fields(src):
    plan = src.cls("sglang.srt.managers.schedule_batch", "NextBatchPlan")
    assert {"batch_to_run", "running_batch"} <= class_fields(plan)
    batch = src.cls("sglang.srt.managers.schedule_batch", "ScheduleBatch")
    assert {"reqs", "forward_mode", "extend_num_tokens", "decoding_reqs"} <= class_fields(batch)
    assert "is_empty" in methods(batch)
    mode = methods(src.cls("sglang.srt.model_executor.forward_batch_info", "ForwardMode"))
    assert {"is_decode", "is_mixed", "is_extend"} <= set(mode)
    assert params(mode["is_decode"]) == ["self"] and params(mode["is_mixed"]) == ["self"]
    assert params(mode["is_extend"])[0] == "self" and len(mode["is_extend"].args.defaults) == len(params(mode["is_extend"])) - 1


def test_tokenizer_manager_event_loop(src):
    tm = src.cls(hooks.TOKENIZER_MODULE, "TokenizerManager")
    fn = methods(tm)["auto_create_handle_loop"]
    assert params(fn) == ["self"]
    assert "event_loop" in self_attributes_set(tm)
    # The first request creates the loop: generate_request calls it.
    assert "auto_create_handle_loop" in self_calls(methods(tm)["generate_request"])


def test_rank_and_plugin_loader(src):
    runtime = src.module("sglang.srt.runtime_context")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "get_parallel" for n in runtime.body)
    assert any(isinstance(n, ast.Constant) and n.value == "tp_rank" for n in ast.walk(runtime))
    plugins = src.module("sglang.srt.plugins")
    groups = [n.value.value for n in plugins.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              and any(isinstance(t, ast.Name) and t.id == "GENERAL_PLUGINS_GROUP" for t in n.targets)]
    assert groups == ["sglang.srt.plugins"]
    assert any(isinstance(n, ast.FunctionDef) and n.name == "load_plugins" for n in plugins.body)


def test_allowlist_functions_exist(src):
    for entry in ALLOW_ENTRIES:
        module = entry.path.removesuffix(".py").replace("/", ".")
        names = {n.name for n in ast.walk(src.module(module)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert entry.function in names, entry


def test_phase_rule_paths_exist(src):
    for rule in PHASE_RULES:
        part = rule.path_part.lstrip("/")
        assert any(("sglang/" + f.split("sglang/", 1)[1]).startswith(part) or part in f for f in src.files), rule


def test_profile_roles():
    assert SGLANG_PROFILE.window_roles == {"api_server"}
    assert [r.name for r in SGLANG_PROFILE.roles if r.step_driven] == ["scheduler"]


def test_request_telemetry_fields(src):
    """What requests.py reads of a finished request (its time stats, tokens, finish reason)."""
    tm = src.cls(hooks.TOKENIZER_MODULE, "TokenizerManager")
    assert params(methods(tm)["_handle_batch_output"])[:2] == ["self", "recv_obj"]
    assert {"rid_to_state", "served_model_name"} <= self_attributes_set(tm)
    state = src.cls(hooks.TOKENIZER_MODULE, "ReqState")
    assert {"finished", "obj", "time_stats"} <= class_fields(state)
    out = src.cls("sglang.srt.managers.io_struct", "BatchStrOutput")
    assert {"finished_reasons", "prompt_tokens", "completion_tokens", "cached_tokens"} <= class_fields(out)
    assert "rids" in class_fields(src.cls("sglang.srt.managers.io_struct", "BaseBatchReq"))
    stats = src.cls("sglang.srt.observability.req_time_stats", "APIServerReqTimeStats")
    assert {"created_time", "first_token_time", "finished_time"} <= class_fields(stats)
    scheduler = src.cls("sglang.srt.observability.req_time_stats", "SchedulerReqTimeStats")
    assert {"wait_queue_entry_time", "forward_entry_time"} <= class_fields(scheduler)


def _constants(module: ast.Module) -> dict[str, object]:
    return {t.id: n.value.value for n in module.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets if isinstance(t, ast.Name)}


def test_scheduler_phase_ranges_are_sglangs_own_stage_ranges(src):
    """Each of the scheduler's phase ranges is one SGLang enters itself, and only under a profiler:
    a ``Scheduler`` method decorated ``@scheduler_stage_method(SCHEDULER_STAGE_X)``, whose range the
    decorator names ``scheduler.<stage>``, through ``profile_range`` (a no-op unless a profiler runs)."""
    stages = src.module("sglang.srt.observability.scheduler_stage_metrics")
    constants = _constants(stages)
    decorator = next(n for n in stages.body if isinstance(n, ast.FunctionDef) and n.name == "scheduler_stage_method")
    assert "f'scheduler.{stage}'" in {ast.unparse(n) for n in ast.walk(decorator) if isinstance(n, ast.JoinedStr)}
    ranged = next(n for n in src.module("sglang.srt.utils.nvtx_utils").body
                  if isinstance(n, ast.FunctionDef) and n.name == "profile_range")
    assert "torch.autograd._profiler_enabled()" in ast.unparse(ranged)
    scheduler = src.cls(hooks.SCHEDULER_MODULE, "Scheduler")
    decorated = {}
    for name, fn in methods(scheduler).items():
        for d in fn.decorator_list:
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "scheduler_stage_method":
                decorated["scheduler." + constants[d.args[0].id]] = name
    mine = [r.name for r in SGLANG_PROFILE.phase_ranges if r.role == "scheduler"]
    assert mine and {decorated.get(name) for name in mine} == {"get_next_batch_to_run", "run_batch",
                                                                 "process_batch_result"}, decorated
    # Within a step: after get_next_batch_to_run (where it begins), before the next ingest_requests.
    calls = self_calls(methods(scheduler)["event_loop_normal"])
    start = calls.index("get_next_batch_to_run")
    assert {"run_batch", "process_batch_result"} <= set(calls[start:])


def test_http_server_phase_range_targets(src):
    """The HTTP server's ranges shadow these methods on the TokenizerManager (hooks.http_server_ranges):
    coroutine methods called through ``self``; output processing awaits nothing but a yield to the
    loop (``asyncio.sleep(0)``, between groups of requests it wakes: their handlers run inside it)."""
    tm = src.cls(hooks.TOKENIZER_MODULE, "TokenizerManager")
    m = methods(tm)
    for name in ("_tokenize_one_request", "_handle_batch_output"):
        assert isinstance(m[name], ast.AsyncFunctionDef), name
        assert any(name in self_calls(fn) for fn in m.values()), name
    awaited = {ast.unparse(n.value) for n in ast.walk(m["_handle_batch_output"]) if isinstance(n, ast.Await)}
    assert awaited <= {"asyncio.sleep(0)"}, awaited


def test_requests_in_flight_fields(src):
    """What requests_view.py reads of the scheduler and its requests."""
    scheduler = src.cls(hooks.SCHEDULER_MODULE, "Scheduler")
    assert {"waiting_queue", "running_batch", "last_batch", "chunked_req", "cur_batch_for_debug"} <= \
        self_attributes_set(scheduler)
    req = src.cls("sglang.srt.managers.schedule_batch", "Req")
    assert {"rid", "origin_input_ids", "output_ids", "retraction_count", "time_stats"} <= self_attributes_set(req)
    assert params(methods(req)["finished"]) == ["self"]
    stats = src.module("sglang.srt.observability.req_time_stats")
    fields = set()
    for node in stats.body:
        if isinstance(node, ast.ClassDef):
            fields |= class_fields(node)
    assert {"created_time", "scheduler_recv_time"} <= fields
