"""What the engine-agnostic core needs to know about SGLang: ``SGLANG_PROFILE`` (``sidecar.engine``).

Handed to every probe (``hooks.py``) and registered under the ``inference_sidecar.engines`` entry
point (pyproject.toml) for tools that read a trace file. Importing this module does not import
SGLang: the version is looked up when a probe starts.
"""

from __future__ import annotations

from sidecar.engine import API_SERVER, SCHEDULER, EngineProfile
from sidecar.common.phases import PhaseRange
from sidecar.syncs.allowlist import AllowEntry
from sidecar.syncs.sites import FORWARD, SAMPLING, SCHEDULING, PhaseRule

# The SGLang releases whose hook targets tests/test_sglang_targets.py checks against the released
# wheels (ingest_requests, NextBatchPlan: 0.5.20 and later). The one place the versions are named.
SUPPORTED_VERSIONS: tuple[str, ...] = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")

# SGLang's processes that get a probe: the HTTP server (its TokenizerManager; records the capture
# window on its event loop) and one scheduler per TP rank, which also runs the model in the same
# thread, so it is the one step-driven role. Its time is Python scheduling as much as ops: sampled
# stacks, not traced ones (SCHEDULER.traced_stacks is False). The detokenizer gets no probe.
ROLES = (API_SERVER, SCHEDULER)
ROLE_API_SERVER, ROLE_SCHEDULER = API_SERVER.name, SCHEDULER.name

# Innermost matching frame wins (checked on 0.5.23). Sampling before forward: the sampler lives under
# layers/, and ModelRunner.sample under model_executor/.
PHASE_RULES: tuple[PhaseRule, ...] = (
    PhaseRule(SAMPLING, "/sglang/srt/layers/sampler.py"),
    PhaseRule(SAMPLING, "/sglang/srt/sampling/"),
    PhaseRule(SAMPLING, "/sglang/srt/model_executor/",
              frozenset({"sample", "compute_logprobs_only", "_preprocess_logits"})),
    PhaseRule(FORWARD, "/sglang/srt/models/"),
    PhaseRule(FORWARD, "/sglang/srt/layers/"),
    PhaseRule(FORWARD, "/sglang/srt/model_executor/"),
    PhaseRule(SCHEDULING, "/sglang/srt/managers/scheduler_components/"),
    PhaseRule(SCHEDULING, "/sglang/srt/managers/scheduler.py"),
    PhaseRule(SCHEDULING, "/sglang/srt/managers/schedule_batch.py"),
    PhaseRule(SCHEDULING, "/sglang/srt/managers/schedule_policy.py"),
    PhaseRule(SCHEDULING, "/sglang/srt/mem_cache/"),
)

# SGLang's deliberate per-step transfers (0.5.13+: SchedulerBatchResultProcessor): each waits on the
# batch's copy_done event and turns the sampled ids (and requested logprobs) into lists.
_RESULTS = "batch_result_processor.py"
_SAMPLED = "SGLang's per-step transfer of the sampled token ids to the host"
ALLOW_ENTRIES: tuple[AllowEntry, ...] = (
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "process_batch_result_prefill", reason=_SAMPLED),
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "process_batch_result_decode", reason=_SAMPLED),
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "process_batch_result_idle",
               reason=_SAMPLED + " (idle batch: waits for the copy)"),
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "_normalize_decode_outputs", reason=_SAMPLED),
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "advance_grammar_fsm",
               reason=_SAMPLED + " (grammar-constrained requests)"),
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "_resolve_spec_v2_tokens",
               reason=_SAMPLED + " (speculative decoding)"),
    AllowEntry(f"sglang/srt/managers/scheduler_components/{_RESULTS}", "move_logprobs_to_cpu",
               reason="SGLang's per-step transfer of requested logprobs"),
)


# The ranges of a step's phases (step anatomy, docs/analysis.md), recorded only while a capture records.
# Scheduler: SGLang's own stage ranges (``@scheduler_stage_method`` in managers/scheduler.py, 0.5.20+),
# which it enters only while a torch profiler runs, so a capture gets them with nothing switched. A
# step (hooks.py) runs get_next_batch_to_run, run_batch (the forward and sampling, or their launch in
# overlap mode) and process_batch_result (of this batch, or of the previous one in overlap mode).
# HTTP server: no scopes in SGLang; the plugin's own (hooks.py, through sidecar.integration.method_ranges).
STAGE_SCHEDULE = "scheduler.get_next_batch_to_run"
STAGE_RUN_BATCH = "scheduler.run_batch"
STAGE_PROCESS_RESULT = "scheduler.process_batch_result"
PROCESS_INPUTS = "sidecar: process inputs"  # TokenizerManager._tokenize_one_request
PROCESS_OUTPUTS = "sidecar: process outputs"  # TokenizerManager._handle_batch_output
PHASE_RANGES: tuple[PhaseRange, ...] = (
    PhaseRange(STAGE_SCHEDULE, "schedule", ROLE_SCHEDULER),
    PhaseRange(STAGE_RUN_BATCH, "forward", ROLE_SCHEDULER),
    PhaseRange(STAGE_PROCESS_RESULT, "update", ROLE_SCHEDULER),
    PhaseRange(PROCESS_INPUTS, "input", ROLE_API_SERVER),
    PhaseRange(PROCESS_OUTPUTS, "output", ROLE_API_SERVER),
)


def sglang_version() -> str:
    """``sglang 0.5.23`` (the probe's hello); ``sglang`` when SGLang's version cannot be read."""
    try:
        from importlib.metadata import version

        return f"sglang {version('sglang')}"
    except Exception:
        return "sglang"


SGLANG_PROFILE = EngineProfile(
    name="sglang",
    roles=ROLES,
    phase_rules=PHASE_RULES,
    allow_entries=ALLOW_ENTRIES,
    phase_ranges=PHASE_RANGES,
    skip_packages=("sidecar_sglang",),  # the plugin's own frames (hook wrappers) are never a sync site
    service_name="sglang",  # OTel resource service.name unless OTEL_SERVICE_NAME says otherwise
    provider="sglang",  # gen_ai.provider.name
    version=sglang_version,
)
