# Two commands for a newcomer: `make demo` and `make test`. Everything installs into .venv/.
PY := .venv/bin/python
MODEL ?= models/tiny
SOAK_MINUTES ?= 30
SOAK_ARGS ?=

.PHONY: install model demo test test-gpu test-sglang test-multi-server test-tensor-parallel test-data-parallel bench soak clean

install:
	@bash scripts/install.sh

model: install
	@$(PY) -m sidecar.cli make-model --size tiny --out models/tiny --quiet-if-exists

demo: install model
	$(PY) -m sidecar_vllm.demo --model $(MODEL)

# Every test that can run without a GPU: SGLang's end-to-end tests need its own venv (.venv/sglang: about
# 10 minutes and 3.8 GB the first time, instant after; docs/sglang.md); the tensor-parallel, data-parallel
# and two-server tests (the targets below run one of them alone) start servers of their own, last.
# Two pytest processes side by side (scripts/run-tests.sh): the tests of real servers, and the rest.
test: install
	@bash scripts/install-test-backends.sh
	@bash scripts/install-browser.sh
	@bash scripts/install-sglang.sh
	bash scripts/run-tests.sh

# Two real vLLM servers sharing one sidecar: engine instances (issue 14; two server starts, about 3 minutes).
# Also part of `make test`, as are the next two.
test-multi-server: install
	$(PY) -m pytest -q -ra -m multi_server tests/e2e/test_vllm_two_servers.py

# Real vLLM with --tensor-parallel-size 2: one instance, two worker ranks, ranks side by side (issues 13, 14;
# one more server start, about 2 minutes).
test-tensor-parallel: install
	$(PY) -m pytest -q -ra -m tensor_parallel tests/e2e/test_vllm_tensor_parallel.py

# Real vLLM with --data-parallel-size 2: two engine cores, each its own sub-instance counting its own steps
# (issue 14; one more server start, about 3 minutes on 2 cores).
test-data-parallel: install
	$(PY) -m pytest -q -ra -m data_parallel tests/e2e/test_vllm_data_parallel.py

# The SGLang tests alone (also in `make test`): real SGLang on CPU from .venv/sglang (docs/sglang.md).
test-sglang: install
	@bash scripts/install-sglang.sh
	$(PY) -m pytest -q -ra -m sglang tests/e2e/test_sglang_capture.py

# On a CUDA host: kernels in captures, real syncs, NVML (tests/gpu; docs/gpu.md). Fails without a device.
test-gpu: install
	SIDECAR_GPU_TESTS=1 $(PY) -m pytest -q -ra tests/gpu

# The alert chain's benchmark runs real Prometheus and Alertmanager, as the tests do.
bench: install
	@bash scripts/install-test-backends.sh
	$(PY) benchmarks/run_all.py

# Not part of test or bench: continuous traffic, captures, scans and sidecar restarts for
# SOAK_MINUTES against real vLLM; writes bench-results/soak-<timestamp>.json (docs/benchmarks.md, Soak).
# More options in SOAK_ARGS, e.g. SOAK_ARGS="--restart-every-min 5 --keep 5".
soak: install model
	$(PY) benchmarks/soak.py --minutes $(SOAK_MINUTES) --model $(MODEL) $(SOAK_ARGS)

clean:
	rm -rf .venv models traces bench-results .pytest_cache
