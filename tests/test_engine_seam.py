"""The engine seam (sidecar.engine): the core imports and names no engine; an engine is a profile.

- Every module of the core imports where neither vLLM nor its integration can be imported, and none
  of them even tries to.
- No engine name appears in the core's code: only in its comments and documentation strings.
- The vLLM profile is found through the ``inference_sidecar.engines`` entry point and carries what the
  core used to hard-code (phase rules, allowlist, skipped package, OpenTelemetry names).
- An engine whose one scheduler process also runs the model (SGLang's shape) is a profile too, with
  no change to the core: identities, labels, order, phases.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest

from sidecar.engine import (
    API_SERVER,
    ENGINE_CORE,
    ENTRY_POINT_GROUP,
    GENERIC,
    STANDARD_ROLES,
    WORKER,
    EngineProfile,
    Role,
    combined,
    installed_profiles,
)
from sidecar.syncs.allowlist import AllowEntry, Allowlist
from sidecar.syncs.sites import FORWARD, OTHER, SAMPLING, SCHEDULING, PhaseRule, SiteLocator, default_skip_dirs

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "sidecar"
ENGINE_NAMES = ("vllm", "sglang")

# Modules of the core that need a dependency the core does not require; none today.
NEEDS_OPTIONAL_DEPENDENCY: frozenset[str] = frozenset()

_IMPORT_CORE_WITHOUT_ENGINES = textwrap.dedent("""
    import importlib, importlib.abc, json, pkgutil, sys

    BLOCKED = ("vllm", "sidecar_vllm", "sglang", "sidecar_sglang")
    asked = []

    class NoEngines(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                asked.append(name)
                raise ImportError(f"{name} is not importable in this test")
            return None

    sys.meta_path.insert(0, NoEngines())
    skip = set(json.loads(sys.argv[1]))
    import sidecar

    imported, failed = [], {}
    for info in pkgutil.walk_packages(sidecar.__path__, "sidecar.", onerror=lambda name: failed.setdefault(name, "walk")):
        if info.name in skip:
            continue
        try:
            importlib.import_module(info.name)
            imported.append(info.name)
        except BaseException as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc}"
    from sidecar.engine import installed_profiles
    profiles = [p.name for p in installed_profiles()]  # the vLLM entry point fails to load: skipped
    print(json.dumps({"imported": imported, "failed": failed, "asked": asked, "profiles": profiles,
                      "engines_loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}))
""")


def test_the_core_imports_with_no_engine_and_no_integration_importable():
    proc = subprocess.run([sys.executable, "-c", _IMPORT_CORE_WITHOUT_ENGINES, json.dumps(sorted(NEEDS_OPTIONAL_DEPENDENCY))],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SIDECAR_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}
    assert len(result["imported"]) > 50 and "sidecar.engine" in result["imported"]
    assert {"sidecar.integration.attach", "sidecar.integration.patching", "sidecar.devtools.stack"} <= set(result["imported"])
    # Only installed_profiles() may look for an engine (the entry point names the vLLM integration),
    # and it skips the profile that does not load.
    assert all(name.split(".")[0] in ("sidecar_vllm", "sidecar_sglang") for name in result["asked"]), result["asked"]
    assert result["profiles"] == [] and result["engines_loaded"] == []


def _code_strings_and_names(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every identifier and every string of ``path`` that is not a documentation
    string; comments are dropped by the tokenizer."""
    source = path.read_text()
    docstrings: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))

    def in_docstring(start: tuple[int, int]) -> bool:
        return any(begin <= start < end for begin, end in docstrings)

    string_kinds = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME or (tok.type in string_kinds and not in_docstring(tok.start)):
            found.append((tok.start[0], tok.string))
    return found


def _engine_names_in_code(path: Path, root: Path = ROOT) -> list[str]:
    """"file:line: text" of each engine name in the code of ``root / path``."""
    return [f"{path}:{line}: {text[:80]!r}" for line, text in _code_strings_and_names(root / path)
            if any(name in text.lower() for name in ENGINE_NAMES)]


def test_the_core_names_no_engine_outside_comments_and_docstrings():
    hits = [hit for path in sorted(CORE.rglob("*.py")) for hit in _engine_names_in_code(path.relative_to(ROOT))]
    assert hits == [], "engine names in the core's code (move them to the engine's profile or plugin):\n" + "\n".join(hits)


def test_the_engine_name_check_sees_code_and_spares_documentation(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent('''
        """Module docstring about vLLM: allowed."""
        # a comment about SGLang: allowed
        import os  # vllm in a trailing comment: allowed


        def f():
            """Docstring naming vllm: allowed."""
            return "vllm"  # a string that is not a docstring: found


        class C:
            "A one-line class docstring naming SGLang: allowed."
            engine = f"{os.sep}sglang"  # found
            vllm_port = 1  # an identifier: found
    '''))
    texts = [text for _, text in _code_strings_and_names(sample) if any(n in text.lower() for n in ENGINE_NAMES)]
    # (an f-string is one token before Python 3.12, its literal parts are tokens of their own after)
    assert len(texts) == 3 and texts[0] == '"vllm"' and "sglang" in texts[1] and texts[2] == "vllm_port"
    assert len(_engine_names_in_code(sample.relative_to(tmp_path), root=tmp_path)) == 3


# -- the vLLM profile, through the entry point ------------------------------------------------------
def test_the_vllm_profile_is_found_through_the_entry_point():
    profiles = {p.name: p for p in installed_profiles()}
    assert "vllm" in profiles, f"no profile under {ENTRY_POINT_GROUP}; is the package installed (scripts/install.sh)?"
    from sidecar_vllm.profile import VLLM_PROFILE

    vllm = profiles["vllm"]
    assert vllm is VLLM_PROFILE
    assert vllm.roles == STANDARD_ROLES == (API_SERVER, ENGINE_CORE, WORKER)
    assert [(r.name, r.label, r.step_driven) for r in vllm.roles] == [
        ("api_server", "API server", False), ("engine_core", "engine core", True), ("worker", "worker", True)]
    assert vllm.window_roles == {"api_server"}
    assert vllm.skip_packages == ("sidecar_vllm",)
    assert (vllm.service_name, vllm.provider) == ("vllm", "vllm")
    assert vllm.describe().startswith("vllm")
    assert [r for r in combined(installed_profiles()).phase_rules if r in vllm.phase_rules] == list(vllm.phase_rules)


def test_the_vllm_profile_classifies_and_phases_as_the_core_did():
    from sidecar_vllm.profile import VLLM_PROFILE

    allowlist = Allowlist(VLLM_PROFILE.allow_entries)

    def site(path, function, op="tolist"):
        return {"file": "/venv/site-packages/" + path, "path": path, "line": 1, "function": function, "op": op}

    for path in ("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/cpu_model_runner.py"):
        cls, reason = allowlist.classify(site(path, "_to_list"))
        assert cls == "expected" and "sampled token" in reason
    assert allowlist.classify(site("vllm/v1/worker/gpu_model_runner.py", "get_output"))[0] == "expected"
    assert allowlist.classify(site("vllm/v1/outputs.py", "tolists"))[0] == "expected"
    assert allowlist.classify(site("vllm/v1/worker/gpu_model_runner.py", "execute_model", "item"))[0] == "hidden"
    assert Allowlist().classify(site("vllm/v1/worker/cpu_model_runner.py", "_to_list"))[0] == "hidden"  # core: none

    def phase(filename, function):
        return next((r.phase for r in VLLM_PROFILE.phase_rules if r.matches_location(filename, function)), OTHER)

    base = "/venv/site-packages/vllm"
    assert phase(f"{base}/v1/sample/sampler.py", "forward") == SAMPLING
    assert phase(f"{base}/v1/worker/gpu_model_runner.py", "_to_list") == SAMPLING
    assert phase(f"{base}/v1/worker/gpu_model_runner.py", "_model_forward") == FORWARD
    assert phase(f"{base}/model_executor/models/llama.py", "forward") == FORWARD
    assert phase(f"{base}/v1/core/sched/scheduler.py", "schedule") == SCHEDULING
    assert phase(f"{base}/v1/worker/gpu_model_runner.py", "_prepare_inputs") == SCHEDULING
    assert phase(f"{base}/v1/worker/gpu_model_runner.py", "execute_model") == OTHER

    import sidecar_vllm

    plugin_dir = os.path.dirname(sidecar_vllm.__file__) + os.sep
    assert plugin_dir in VLLM_PROFILE.skip_dirs() and plugin_dir not in default_skip_dirs()
    assert str(CORE) + os.sep in default_skip_dirs()


def test_the_core_has_no_engine_defaults():
    assert SiteLocator()._rules == ()
    assert Allowlist().entries == ()
    assert (GENERIC.phase_rules, GENERIC.allow_entries, GENERIC.skip_packages) == ((), (), ())
    assert combined([]) is GENERIC


# -- an engine shaped like SGLang: one scheduler process that also runs the model ----------------------
SCHEDULER = Role("scheduler", "scheduler", step_driven=True)
SINGLE = EngineProfile(
    name="single",
    roles=(SCHEDULER,),
    phase_rules=(
        PhaseRule(SAMPLING, "/single_engine/sampling/"),
        PhaseRule(FORWARD, "/single_engine/model/"),
        PhaseRule(SCHEDULING, "/single_engine/", frozenset({"event_loop_normal", "get_next_batch_to_run"})),
    ),
    allow_entries=(AllowEntry("single_engine/sampling/*.py", "to_host", reason="the sampled ids"),),
    skip_packages=("json",),  # any importable package: its frames are passed over
    service_name="single-engine",
    provider="single",
)


def test_a_single_scheduler_engine_is_a_profile():
    assert SINGLE.window_roles == frozenset()
    assert SINGLE.role("scheduler") is SCHEDULER
    with pytest.raises(ValueError, match="no role 'api_server'"):
        SINGLE.role("api_server")
    with pytest.raises(ValueError, match="no step-driven role"):
        EngineProfile(name="bad", roles=(Role("api_server", "API server", step_driven=False),))
    with pytest.raises(ValueError, match="duplicate"):
        EngineProfile(name="bad", roles=(SCHEDULER, SCHEDULER))
    with pytest.raises(ValueError, match="role name"):
        Role("Scheduler!", "x", step_driven=True)

    # Identities: one per tensor-parallel rank, labelled and ordered by the core from the profile alone.
    ranks = [SINGLE.identity("scheduler", rank, pid=100 + rank, host="h", engine="single 1.0") for rank in (1, 0)]
    assert [i.label for i in ranks] == ["scheduler rank 1 (pid 101)", "scheduler rank 0 (pid 100)"]
    assert all(i.step_driven and i.role == "scheduler" and i.engine == "single 1.0" for i in ranks)
    assert [i.file_stem for i in sorted(ranks, key=lambda i: i.sort_key)] == ["scheduler-rank0-pid100", "scheduler-rank1-pid101"]
    assert SINGLE.identity("scheduler", 0, pid=1).engine == "single"  # no version: the profile's name
    # Next to the standard roles, window processes still sort first.
    mixed = ranks + [GENERIC.identity("api_server", pid=5), GENERIC.identity("engine_core", pid=6)]
    assert [i.role for i in sorted(mixed, key=lambda i: i.sort_key)] == ["api_server", "engine_core", "scheduler", "scheduler"]

    # Telemetry names come from the profile.
    from sidecar.telemetry import create_telemetry

    telemetry = create_telemetry("scheduler", 0, profile=SINGLE, env={"SIDECAR_TELEMETRY": "0"})
    assert telemetry.resource.attributes["service.name"] == "single-engine"
    assert telemetry.resource.attributes["sidecar.process.role"] == "scheduler"


def test_a_single_scheduler_engines_phase_rules_and_skipped_packages_apply_to_real_stacks():
    import sys as _sys

    frames = {}
    namespace: dict = {"_sys": _sys, "frames": frames}

    def load(filename: str, source: str) -> None:
        exec(compile(textwrap.dedent(source), filename, "exec"), namespace)

    load("/opt/single_engine/model/llama.py", """
        def model_forward():
            frames["forward"] = _sys._getframe()
    """)
    load("/opt/single_engine/sampling/sampler.py", """
        def to_host():
            frames["sampling"] = _sys._getframe()
    """)
    load("/opt/single_engine/managers/scheduler.py", """
        def event_loop_normal(step):
            step()

        def handle_request():
            frames["other"] = _sys._getframe()
    """)
    namespace["event_loop_normal"](namespace["model_forward"])
    namespace["event_loop_normal"](namespace["to_host"])
    namespace["handle_request"]()

    locator = SINGLE.site_locator()
    forward, sampling = locator.locate(frames["forward"]), locator.locate(frames["sampling"])
    assert (forward.file, forward.function, forward.phase) == ("/opt/single_engine/model/llama.py", "model_forward", FORWARD)
    assert (sampling.function, sampling.phase) == ("to_host", SAMPLING)
    assert locator.locate(frames["other"]).phase == OTHER
    assert SiteLocator().locate(frames["forward"]).phase == OTHER  # the core knows no engine's phases

    # A frame in a skipped package is passed over: the site is its caller.
    import json as json_module

    skipped_file = os.path.join(os.path.dirname(json_module.__file__), "fake_hook.py")
    load(skipped_file, """
        def hook():
            frames["hooked"] = _sys._getframe()
    """)
    load("/opt/single_engine/model/caller.py", """
        def call_hook():
            hook()
    """)
    namespace["call_hook"]()
    site = locator.locate(frames["hooked"])
    assert (site.file, site.function, site.phase) == ("/opt/single_engine/model/caller.py", "call_hook", FORWARD)
    assert SiteLocator().locate(frames["hooked"]).function == "hook"  # not skipped without the profile

    site_dict = {"file": "/opt/single_engine/sampling/sampler.py", "path": "single_engine/sampling/sampler.py",
                 "line": 3, "function": "to_host", "op": "tolist"}
    assert Allowlist(SINGLE.allow_entries).classify(site_dict) == ("expected", "the sampled ids")


def test_combined_profiles_keep_every_rule_and_entry():
    from sidecar_vllm.profile import VLLM_PROFILE

    both = combined([VLLM_PROFILE, SINGLE])
    assert both.phase_rules == VLLM_PROFILE.phase_rules + SINGLE.phase_rules
    assert both.allow_entries == VLLM_PROFILE.allow_entries + SINGLE.allow_entries
    assert both.skip_packages == ("sidecar_vllm", "json")
    assert combined([SINGLE]) is SINGLE
