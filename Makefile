# LedgerMQ: `make run` starts a name server and a 3-member DLedger broker set on loopback;
# `make test` runs the whole suite. Both create .venv on first use.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint fault bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ledgermq-run

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

fault: $(STAMP)
	$(BIN)/python -m pytest -q -m 'fault or fault_full' tests/fault; rc=$$?; \
	$(BIN)/python -m tests.fault.report; exit $$rc

bench: $(STAMP)
	for b in bench/*_bench.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
