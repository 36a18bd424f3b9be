# `make test` and `make bench` are the only set-up commands a newcomer needs: each creates .venv on
# first use (or when pyproject.toml / constraints.txt change) with the pinned versions.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ddpbench-installed

# Parallel test workers; the suite's distributed tests start 2-rank pools, so 2 workers suit 2 cores.
# Each test file runs on one worker (--dist loadfile), so a file's module-scoped pool starts once.
TEST_WORKERS ?= 2
TEST_DIST    := -n $(TEST_WORKERS) --dist loadfile

.PHONY: test test-fast bench compare venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# ruff first (seconds): a finding fails make test before the suite runs.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests lab benchmarks examples
	$(PY) -m pytest tests/ $(TEST_DIST)

# The unit tests alone, without the `pool` tests (those that start rank processes or a pytest,
# torchrun or bisect run: tests/conftest.py marks them and fails one that starts them unmarked).
test-fast: $(STAMP)
	$(VENV)/bin/ruff check src tests lab benchmarks examples
	$(PY) -m pytest tests/ -m "not pool and not slow" $(TEST_DIST)

# --benchmark-save-data keeps every round's time in the saved run (autosave alone keeps only summary
# stats), which `ddpbench compare` needs for its confidence intervals. The run ends with the report
# tables (also when some cases failed: make still exits with pytest's status); charts go to
# reports/<run>/.
bench: $(STAMP)
	status=0; $(PY) -m pytest benchmarks/ --benchmark-autosave --benchmark-save-data || status=$$?; \
	$(VENV)/bin/ddpbench report || true; exit $$status

# The noise-aware gate between the two newest saved runs (exit 1 on a regression).
compare: $(STAMP)
	$(VENV)/bin/ddpbench compare

clean:
	rm -rf $(VENV) .pytest_cache src/*.egg-info
