# One command sets up and runs the demo (`make run`); one sets up and runs the tests (`make test`,
# the fast tier, a few minutes; `make test-all`, everything, what CI runs).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.installed

.PHONY: run test test-all checks lint typecheck fmt venv simulate bench lock clean

venv: $(STAMP)

# torch's CPU wheels (PyPI's torch for Linux is the CUDA build). Where this index cannot be
# reached, pip finds torch in the indexes it is configured with (one quick retry, no waits).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

# First time only: a venv from the repo's own pins (torch CPU wheel, torchrec without its
# CUDA-only dependency, then the project with every extra).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -qq --retries 1 --extra-index-url $(TORCH_INDEX) -c constraints.txt \
		torch==2.13.0 fbgemm-gpu-cpu==1.8.0
	$(PIP) install -q --no-deps torchrec==1.8.0
	$(PIP) install -q -c constraints.txt -e ".[all,dev]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dlrover-rm demo

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache --no-logo

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Lint and type checks run first but never stop the tests; the target fails at the end if
# either the checks or the tests did.
CHECKS = $(MAKE) --no-print-directory lint && $(MAKE) --no-print-directory typecheck

# The fast tier: no test in it trains for more than a few seconds (slow ones: -m slow).
test: $(STAMP)
	@$(CHECKS); checks=$$?; \
	$(PY) -m pytest -q -m "not slow" --durations=10; tests=$$?; \
	[ $$checks -eq 0 ] || echo "make test: lint or type checks failed (see above)"; \
	[ $$tests -eq 0 ] && [ $$checks -eq 0 ]

# Everything: the fast tier and the slow one (real training, fault matrix, pipelines).
test-all: $(STAMP)
	@$(CHECKS); checks=$$?; \
	$(PY) -m pytest -q --durations=25; tests=$$?; \
	[ $$checks -eq 0 ] || echo "make test-all: lint or type checks failed (see above)"; \
	[ $$tests -eq 0 ] && [ $$checks -eq 0 ]

simulate: $(STAMP)
	$(PY) benchmarks/simulate_paper_table.py --jobs 1000 --json benchmarks/results/simulate.json

lock:
	rm -rf /tmp/dlrover-rm-lock && $(PYTHON) -m venv /tmp/dlrover-rm-lock
	/tmp/dlrover-rm-lock/bin/pip install -qq --retries 1 --extra-index-url $(TORCH_INDEX) \
		torch==2.13.0 fbgemm-gpu-cpu==1.8.0
	/tmp/dlrover-rm-lock/bin/pip install -q -e ".[all,dev]"
	/tmp/dlrover-rm-lock/bin/pip freeze | grep -v -i -E "^(-e|torchrec|dlrover-rm)" > constraints.txt.new
	@echo "review and move constraints.txt.new to constraints.txt"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
