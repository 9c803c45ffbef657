# Two commands do all the set-up: `make book` and `make test`.
# Both create (or reuse) .venv and install the versions pinned in requirements.lock;
# `make test` adds the test and development tools pinned in requirements-dev.lock.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.crs-installed
DEV_STAMP := $(VENV)/.crs-dev-installed
PRESET ?= default
PYTEST_ARGS ?=
# make test runs one pytest-xdist worker per core; TEST_WORKERS=0 runs the tests in one process
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
# analysis modules that `make mutation` mutates (see [tool.mutmut] in pyproject.toml)
MODULES ?= agreement neighbors ann recall similarity subgroups factors probes splits stats _resample metrics audit shortcut risk risk_results risk_needs risk_scores risk_multiclass risk_select risk_inputs risk_metrics transfer protocol checklist checklist_items
# own: a mutant runs only its module's own tests (tests/conftest.py OWN_TESTS); all: every fast test reaching it
SCOPE ?= own

# Nothing downloads at run time: the HF hub fails fast instead of retrying.
export HF_HUB_OFFLINE := 1
export CRS_CACHE_DIR ?= $(CURDIR)/.cache/crs
export MPLBACKEND := Agg
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install install-dev book test test-all bench mutation clean help

help:
	@echo "make book   build the book on the embedded phantom data (PRESET=quick|default|full)"
	@echo "make test   run the test suite (without the training tier)"
	@echo "make test-all  the whole test suite, the training tier included (retraining, objectives from scratch)"
	@echo "make bench  run the benchmarks in bench/"
	@echo "make mutation  mutation testing of the analysis modules (MODULES=\"stats metrics\" for some)"

# The stamp is newer than the lock file once the install succeeded, so a
# second run skips the install unless requirements.lock or pyproject.toml changed.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

# the test and development tools (pytest, selenium, mutmut, actionlint), on top of the user install
$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.lock
	@touch $@

install: $(STAMP)

install-dev: $(DEV_STAMP)

book: $(STAMP)
	$(BIN)/crs book --preset $(PRESET)

# the training tier (tests that train zoo models or fine-tune from scratch) and the weekly tier (a second
# check of what make test checks another way: nbval) run in test-all and the weekly workflow
test: $(DEV_STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not training and not weekly" $(PYTEST_ARGS)

test-all: $(DEV_STAMP)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

bench: $(STAMP)
	@set -e; for script in bench/bench_*.py; do echo "== $$script"; $(BIN)/python $$script; done

# Mutation testing (mutmut): every mutant of MODULES runs the fast tests that reach its function;
# tools/mutation_report.py then writes the kill rate per module and each survivor's diff to
# mutants/report.md. RECHECK=1 runs only the mutants the last run left open (after new tests);
# SCOPE (see tests/conftest.py) chooses which tests a mutant runs.
mutation: export CRS_MUTATION_SCOPE = $(SCOPE)
mutation: $(DEV_STAMP)
	@if [ -n "$(RECHECK)" ]; then \
	    open=$$($(BIN)/python tools/mutation_report.py --open $(MODULES)) || exit $$?; \
	    if [ -n "$$open" ]; then $(BIN)/mutmut run --max-children $$(nproc) $$open; fi; \
	else \
	    $(BIN)/mutmut run --max-children $$(nproc) $(foreach m,$(MODULES),'crslib.$(m).*'); \
	fi
	$(BIN)/python tools/mutation_report.py $(MODULES)

clean:
	rm -rf _build book/generated .cache mutants
