# LedgerMQ: `make run` starts a name server and a 3-member DLedger broker set on loopback
# (`make run SETS=2`: two sets, broker-a and broker-b);
# `make test` runs the suite but the long fault scenarios (`make fault-full`; `make fault` = all
# of the fault matrix; `make test FAULT_FULL=1` = the suite and all of it, as CI (.ci/run) runs it).
# All create .venv on first use.
PY ?= python3.11
SETS ?= 1
FAULT_JOBS ?= 1
FAULT_XDIST := $(if $(filter-out 1,$(FAULT_JOBS)),-n $(FAULT_JOBS) --dist load)
FAULT_FULL ?=
TEST_FAULT_MARK := $(if $(filter 1,$(FAULT_FULL)),fault_full or not fault_full,not fault_full)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint fault fault-full bench clean browser-deps bytecode

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) bytecode

# Compiled here once: where PYTHONDONTWRITEBYTECODE is set (as on CI's machines), every broker, name
# server and test process would otherwise compile our sources again as it starts (~0.3 s of CPU each).
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 apidocs broker client console dledger listener namesrv pipeline wire tests >/dev/null

run: $(STAMP) bytecode
	$(BIN)/ledgermq-run --sets $(SETS)

# tests/browser drive Debian's Chromium: installed here when root (CI), else those tests skip.
browser-deps:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 \
	  || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } \
	  || echo "chromium could not be installed: the browser tests will be skipped" >&2; \
	fi

# Three parts, each run even if one before failed: the tests that time failovers or deadlines
# (marker serial, tests/conftest.py) alone; tests/fault two at a time, beside nothing but each
# other (a scenario keeps the two cores ~60 % busy; their bounds hold in pairs, docs/RELIABILITY.md),
# with FAULT_FULL=1 every scenario and the results table; the rest two at a time, a test file per
# worker (its module fixtures start once).
test: $(STAMP) browser-deps bytecode
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m 'serial and not fault_full' --ignore=tests/fault; s=$$?; \
	$(BIN)/python -m pytest -q -n 2 --dist load -m '$(TEST_FAULT_MARK)' tests/fault; f=$$?;$(if $(filter 1,$(FAULT_FULL)), $(BIN)/python -m tests.fault.report;) \
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m 'not serial and not fault_full' --ignore=tests/fault; p=$$?; \
	for rc in $$s $$f; do if [ $$rc -ne 0 ]; then exit $$rc; fi; done; exit $$p

lint: $(STAMP)
	$(BIN)/ruff check .

# FAULT_JOBS=2 runs the scenarios two at a time (as CI does): half the wall time, new-master
# figures a little higher than alone (docs/RELIABILITY.md).
fault: $(STAMP) bytecode
	$(BIN)/python -m pytest -q $(FAULT_XDIST) -m 'fault or fault_full' tests/fault; rc=$$?; \
	$(BIN)/python -m tests.fault.report; exit $$rc

# The fault scenarios `make test` leaves out (marker fault_full).
fault-full: $(STAMP) bytecode
	$(BIN)/python -m pytest -q $(FAULT_XDIST) -m fault_full tests/fault; rc=$$?; \
	$(BIN)/python -m tests.fault.report; exit $$rc

# The benchmarks' peers: nats-py (the `bench` extra) and, as root, Debian's nats-server; without
# them bench/sdk_bench.py reports its NATS row as skipped.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ] && [ "$$(id -u)" = 0 ]; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null 2>&1 \
	  || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null 2>&1; } \
	  || echo "nats-server could not be installed: the NATS peer rows will be skipped" >&2; \
	fi
	for b in bench/*_bench.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
