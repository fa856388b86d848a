"""What the engine-agnostic core needs to know about vLLM: ``VLLM_PROFILE`` (``sidecar.engine``).

Handed to every probe (``hooks.py``) and to the request telemetry (``stat_logger.py``), and registered
under the ``inference_sidecar.engines`` entry point (pyproject.toml) for tools that read a trace file
(``sidecar.analysis.sync_sites.scan_trace``). Importing this module does not import vLLM: the version is looked up when a
probe starts.
"""

from __future__ import annotations

from sidecar.engine import API_SERVER, ENGINE_CORE, WORKER, EngineProfile
from sidecar.common.phases import PhaseRange
from sidecar.syncs.allowlist import AllowEntry
from sidecar.syncs.sites import FORWARD, SAMPLING, SCHEDULING, PhaseRule

from . import phase_scopes as scopes

# vLLM's processes: the API server (records for the capture window on its event loop), the engine
# core (EngineCore.step) and one worker per rank (Worker.execute_model / sample_tokens).
ROLES = (API_SERVER, ENGINE_CORE, WORKER)
ROLE_API_SERVER, ROLE_ENGINE_CORE, ROLE_WORKER = API_SERVER.name, ENGINE_CORE.name, WORKER.name

# vLLM V1 (checked on 0.32). Sampling before forward: the sampler runs inside execute_model too.
PHASE_RULES: tuple[PhaseRule, ...] = (
    PhaseRule(SAMPLING, "/vllm/v1/sample/"),
    PhaseRule(SAMPLING, "/vllm/v1/worker/", frozenset({"sample_tokens", "_sample", "_bookkeeping_sync", "_to_list"})),
    PhaseRule(FORWARD, "/vllm/v1/worker/", frozenset({"_model_forward"})),
    PhaseRule(FORWARD, "/vllm/model_executor/"),
    PhaseRule(SCHEDULING, "/vllm/v1/core/sched/"),
    PhaseRule(SCHEDULING, "/vllm/v1/worker/", frozenset({"_prepare_inputs", "_update_states", "_prepare_input_ids"})),
)

# vLLM V1 (checked against 0.32's source). Each is a transfer vLLM makes on purpose once per step.
_SAMPLED = "vLLM's per-step transfer of the sampled token ids to the host"
ALLOW_ENTRIES: tuple[AllowEntry, ...] = (
    # GPUModelRunner._to_list: pinned copy_(non_blocking) + transfer_event.synchronize() + tolist().
    AllowEntry("vllm/v1/worker/gpu_model_runner.py", "_to_list", reason=_SAMPLED),
    # CPUModelRunner._to_list: sampled_token_ids.tolist() (no events on CPU).
    AllowEntry("vllm/v1/worker/cpu_model_runner.py", "_to_list", reason=_SAMPLED),
    # AsyncGPUModelRunnerOutput.get_output (async scheduling): async_copy_ready_event.synchronize()
    # then sampled_token_ids_cpu.tolist().
    AllowEntry("vllm/v1/worker/gpu_model_runner.py", "get_output", reason=_SAMPLED + " (async scheduling)"),
    # LogprobsTensors.tolists(): requested logprobs go to the host with the sampled tokens.
    AllowEntry("vllm/v1/outputs.py", "tolists", reason="vLLM's per-step transfer of requested logprobs"),
)


# The ranges of a step's phases, recorded only while a capture records (phase_scopes.py switches them).
# Worker: vLLM's own scopes (GPUModelRunner, inherited by the CPU runner); "postprocess" is the logits,
# part of the model's pass; "bookkeep" brings the sampled tokens to the host, sampling as PHASE_RULES
# files it. Engine core and API server: vLLM has none there, these are the plugin's.
PHASE_RANGES: tuple[PhaseRange, ...] = (
    PhaseRange("gpu_model_runner: preprocess", "prepare", ROLE_WORKER),
    PhaseRange("gpu_model_runner: forward", "forward", ROLE_WORKER),
    PhaseRange("gpu_model_runner: postprocess", "forward", ROLE_WORKER),
    PhaseRange("gpu_model_runner: sample", "sample", ROLE_WORKER),
    PhaseRange("gpu_model_runner: bookkeep", "sample", ROLE_WORKER),
    PhaseRange(scopes.SCHEDULE, "schedule", ROLE_ENGINE_CORE),
    PhaseRange(scopes.SEND_TO_WORKERS, "dispatch", ROLE_ENGINE_CORE),
    PhaseRange(scopes.WAIT_FOR_MODEL, "wait_model", ROLE_ENGINE_CORE),
    PhaseRange(scopes.UPDATE_FROM_OUTPUT, "update", ROLE_ENGINE_CORE),
    PhaseRange(scopes.PROCESS_INPUTS, "input", ROLE_API_SERVER),
    PhaseRange(scopes.PROCESS_OUTPUTS, "output", ROLE_API_SERVER),
)


def vllm_version() -> str:
    """``vllm 0.32.0`` (the probe's hello); ``vllm`` when vLLM's version cannot be read."""
    try:
        import vllm

        return f"vllm {vllm.__version__}"
    except Exception:
        return "vllm"


VLLM_PROFILE = EngineProfile(
    name="vllm",
    roles=ROLES,
    phase_rules=PHASE_RULES,
    allow_entries=ALLOW_ENTRIES,
    skip_packages=("sidecar_vllm",),  # the plugin's own frames (hook wrappers) are never a sync site
    service_name="vllm",  # OTel resource service.name unless OTEL_SERVICE_NAME says otherwise
    provider="vllm",  # gen_ai.provider.name
    version=vllm_version,
    phase_ranges=PHASE_RANGES,
)
