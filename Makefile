# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv and install what they need (pinned by constraints.txt) on first use:
# probust with every extra, [all,dev]. `make test-core` checks the core without any extra.
PYTHON ?= python3
CORE_PYTHON ?= python3.11
VENV := .venv
CORE_VENV := .venv-core
CORE_STAMP := $(CORE_VENV)/.dependencies-stamp
CORE_DEPENDENCIES := "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))"
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Test files spread over one worker per CPU (pytest-xdist; each test runs on one thread, and a
# file stays on one worker so its module fixtures are built once); TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo test test-all test-slow test-cuda test-core core-deps mutation lint bench bench-gate install clean

$(STAMP): pyproject.toml constraints.txt
	@echo "Installing probust with every extra into $(VENV)/ (versions pinned by constraints.txt; 1-2 minutes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -c constraints.txt -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/probust demo

# The fast suite (what CI runs first); `make test-all` adds the tests marked slow.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The tests marked slow alone (CI's last part): a few tests of minutes each, so each worker takes
# the next test as it frees up (worksteal: 734 s against 777 s by files on 2 cores).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The GPU suite (tests/cuda: CUDA against CPU, bitwise repetition, CUDA memory budgets and plans,
# a 2-rank nccl torchrun on two GPUs); every test skips where no CUDA device is visible.
test-cuda: $(STAMP)
	$(BIN)/python -m pytest -m cuda $(PYTEST_ARGS)

# The core alone (what `pip install probust` gives: torch, numpy, scipy): a fresh venv holding
# probust built from this tree with its own dependencies only, then every estimator on a small
# model and the errors that name a missing extra (tests/core_only/check_core.py).
test-core: $(CORE_STAMP)
	$(CORE_VENV)/bin/pip install -qq -c constraints.txt .
	cd tests/core_only && ../../$(CORE_VENV)/bin/python check_core.py
	rm -rf $(CORE_VENV)

# The core's fresh venv with pyproject's [project] dependencies and nothing else: it reads no file
# that .venv's install writes, so CI builds it beside that install (`make core-deps`).
core-deps: $(CORE_STAMP)

$(CORE_STAMP): pyproject.toml constraints.txt
	rm -rf $(CORE_VENV)
	$(CORE_PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/pip install -qq -c constraints.txt $$($(CORE_PYTHON) -c $(CORE_DEPENDENCIES))
	touch $(CORE_STAMP)

# The suite's strength: single-line bugs planted one at a time in a temporary copy of src/
# (benchmarks/mutation_check.py lists them); fails if the tests named for one pass on it.
mutation: $(STAMP)
	$(BIN)/python benchmarks/mutation_check.py

# Lint, format, types and the architecture contracts (pyproject.toml configures each tool).
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_mvn.py
	$(BIN)/python benchmarks/bench_estimators.py

# The speed gate (CI): each headline ratio against what a user would otherwise run (the paper's
# approach, a plain Monte Carlo loop, Cohen et al.'s CERTIFY), alternating in one process; fails
# below its floor (benchmarks/gate.py; about 2 minutes on 2 cores, nothing else running). glibc's
# allocator is pinned (GATE_MALLOC): with its adaptive mmap threshold, the references' few-MB
# batches were served from fresh pages in some processes and not others (Cohen et al.'s code 3.5
# or 4.9 s for the same work), which made a run's ratios bimodal.
GATE_MALLOC := MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456
bench-gate: $(STAMP)
	$(GATE_MALLOC) $(BIN)/python benchmarks/gate.py

clean:
	rm -rf $(VENV) $(CORE_VENV) build dist src/*.egg-info .pytest_cache
