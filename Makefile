# Two commands for a newcomer: `make demo` and `make test`. Everything installs into .venv/.
PY := .venv/bin/python
MODEL ?= models/tiny

.PHONY: install model demo test bench clean

install:
	@bash scripts/install.sh

model: install
	@$(PY) -m sidecar.cli make-model --size tiny --out models/tiny --quiet-if-exists

demo: install model
	$(PY) -m sidecar_vllm.demo --model $(MODEL)

test: install
	@bash scripts/install-test-backends.sh
	$(PY) -m pytest -q -ra

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf .venv models traces bench-results .pytest_cache
