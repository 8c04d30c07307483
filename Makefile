# The README's commands. Each target does its own set-up: a venv under .venv and the project
# installed into it, redone only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo run test bench lint stop clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

## demo: one banking conversation that pauses for your approval (echo y | make demo)
demo: setup
	$(PY) -m client.demo

## run: the worker hosting the example agents, plus the dev server unless TEMPORAL_ADDRESS is set
run: setup
	$(PY) -m worker --dev-server

## test: the whole suite against a real Temporal dev server
test: setup
	$(PY) -m pytest

## bench: the benchmarks; results land in bench/results/
bench: setup
	$(PY) -m bench

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

## stop: stop the dev server that `make demo` left running
stop:
	@if [ -f .temporal/dev-server.pid ]; then kill $$(cat .temporal/dev-server.pid) 2>/dev/null || true; rm -f .temporal/dev-server.pid; echo "stopped"; else echo "no dev server pid file"; fi

clean: stop
	rm -rf $(VENV) .temporal .pytest_cache .ruff_cache
