# The commands of the README and docs/. Each target does its own set-up: a venv under .venv and the project
# installed into it, redone only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Written by whoever starts the embedded dev server (worker/devserver.py); read by `make stop`.
DEV_PID := .temporal/dev-server.pid
# The official AG-UI client tests/test_agui_client.py drives, and the stamp of its npm install.
AGUI_CLIENT := tests/agui_client
AGUI_STAMP := $(AGUI_CLIENT)/node_modules/.installed

.PHONY: setup browser agui-client demo run test docs dist bench soak lint stop clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,docs]'
	touch $(STAMP)

## demo: one banking conversation that pauses for your approval (echo y | make demo)
demo: setup
	$(PY) -m examples.demo

## run: the worker hosting the example agents, plus the dev server unless an address is configured
# (TEMPORAL_ADDRESS or a profile): a configured server that is down is reported, not replaced.
# The web app too, on http://127.0.0.1:8234 (AG-UI, the approvals API, the inbox at /inbox).
run: setup
	$(PY) -m temporal_agent_interrupts.worker --dev-server --agents examples --web 127.0.0.1:8234

## browser: the Chromium the browser tests drive, installed from Debian's packages when missing
# (as root or through sudo); nothing to do when it is there, or with AGENT_TEST_CHROMIUM or
# AGENT_TEST_SKIP_BROWSER=1 set. See scripts/install-chromium.
browser:
	@bash scripts/install-chromium

## agui-client: the npm packages of the AG-UI client (@ag-ui/client), installed from its lockfile
# (npm ci, from the npm registry) when node_modules is missing or older than the lockfile or
# package.json; nothing to do with AGENT_TEST_SKIP_AGUI_CLIENT=1 set. Needs Node.js 20+ and npm.
agui-client: $(AGUI_STAMP)

$(AGUI_STAMP): $(AGUI_CLIENT)/package-lock.json $(AGUI_CLIENT)/package.json
	@if [ "$${AGENT_TEST_SKIP_AGUI_CLIENT:-}" = "1" ]; then exit 0; fi; \
	if ! command -v npm >/dev/null 2>&1; then \
		echo "the AG-UI client tests need Node.js 20 or newer with npm (https://nodejs.org, or" \
			"Debian's nodejs and npm packages where they are 20+); or set AGENT_TEST_SKIP_AGUI_CLIENT=1" \
			"to skip them knowingly" >&2; \
		exit 1; \
	fi; \
	echo "npm ci --prefix $(AGUI_CLIENT)"; \
	npm ci --prefix $(AGUI_CLIENT) --no-audit --no-fund && touch $@

## test: the whole suite against a real Temporal dev server
# On TEST_WORKERS pytest-xdist workers, each a session with its own dev servers, sharing the files
# as tests/scheduling.py says (TEST_WORKERS=0: one process, as a bare `pytest` runs).
TEST_WORKERS ?= 2
test: setup browser agui-client
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

## docs: the docs site on http://127.0.0.1:8000, rebuilt as the pages change (offline)
# DOCS_BIND=HOST:PORT to serve elsewhere; `mkdocs build --strict` is what the tests run.
DOCS_BIND ?= 127.0.0.1:8000
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr $(DOCS_BIND)

## dist: the release: an sdist, and a wheel built from it, in dist/, checked by twine
# Offline: --no-isolation builds with the venv's own setuptools (a test extra), no download.
# scripts/check-dist-tree first: the build ships every module in the package's folders, tracked
# or not, and follows links.
dist: setup
	$(PY) scripts/check-dist-tree
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

## bench: the benchmarks; results land in bench/results/
bench: setup
	$(PY) -m bench

## soak: conversations under load while workers and the server are killed, then the invariants
# checked (ten minutes; three workers, 200 conversations in flight, seed 2026; see bench/soak).
# Writes bench/results/soak.json and soak.png; exits non-zero on any violation. SOAK_ARGS adds
# flags (SOAK_ARGS="--duration 60 --conversations 20 --seed 7").
soak: setup
	$(PY) -m bench.soak $(SOAK_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

## stop: stop the dev server that `make demo` left running (`make run` stops its own on exit)
# Only a pid that is still a Temporal dev server (`temporal ... server start-dev`) is killed: the
# pid in a stale file may since have been given to any other process. (-ww: whole command lines,
# whatever COLUMNS says.) The file's second line is the pid that started the server; while that
# process is still the server's parent (`make run`'s worker), the server is its to stop, and
# stopping it here would pull the server from under a running worker. Exits 1 then, so that
# `make clean` does not delete the data of a server still in use.
stop:
	@if [ ! -f $(DEV_PID) ]; then echo "no dev server running"; exit 0; fi; \
	pid=$$(sed -n 1p $(DEV_PID) | tr -cd '0-9'); \
	owner=$$(sed -n 2p $(DEV_PID) | tr -cd '0-9'); \
	is_server() { ps -ww -p "$$pid" -o args= 2>/dev/null | grep -q 'temporal.*start-dev'; }; \
	if [ -n "$$pid" ] && is_server; then \
		parent=$$(ps -p "$$pid" -o ppid= 2>/dev/null | tr -cd '0-9'); \
		if [ -n "$$owner" ] && { [ "$$parent" = "$$owner" ] || \
			ps -ww -p "$$owner" -o args= 2>/dev/null | grep -qE -- "(temporal_agent_interrupts\.worker|agent-worker) .*--dev-server"; }; then \
			echo "left the dev server (pid $$pid) running: it belongs to pid $$owner" \
				"($$(ps -ww -p "$$owner" -o args= 2>/dev/null)), which is still running; stop that instead"; \
			exit 1; \
		fi; \
		kill "$$pid" || { echo "could not stop the dev server (pid $$pid)"; exit 1; }; \
		for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do \
			is_server || break; sleep 0.5; \
		done; \
		echo "stopped the dev server (pid $$pid)"; \
	else \
		echo "no dev server running (removed the stale $(DEV_PID))"; \
	fi; \
	rm -f $(DEV_PID)

clean: stop
	rm -rf $(VENV) .temporal .pytest_cache .ruff_cache build dist *.egg-info $(AGUI_CLIENT)/node_modules
