# The two commands a new user types (README):  make run   /   make test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: run test lint install browser sandbox galera services bench bench-check clean

$(BIN)/agentcanvas: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# ragflow-sdk 0.27.x beside the 0.22.1 that setup.cfg installs: 0.27 declares Python >= 3.13
# but is pure Python. Its own directory, put on sys.path only by the tests' `sdk` fixture
# (tests/e2e/conftest.py), so both generations of the SDK run against the server.
SDK_CURRENT := $(VENV)/ragflow-sdk-0.27
$(SDK_CURRENT)/ragflow_sdk/__init__.py: $(BIN)/agentcanvas Makefile
	rm -rf $(SDK_CURRENT)
	$(BIN)/pip install -q --no-deps --ignore-requires-python --target $(SDK_CURRENT) 'ragflow-sdk>=0.27,<0.28'
	touch $@

install: $(BIN)/agentcanvas $(SDK_CURRENT)/ragflow_sdk/__init__.py

# The server on SQLite (./data/) with the samples loaded; prints a token and embed URLs.
run: install
	$(BIN)/agentcanvas quickstart --host $(HOST) --port $(PORT)

# Debian's Chromium for the browser tests (Playwright's own download does not work offline).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# Debian's bubblewrap and nodejs: CodeExec's sandbox (agent/sandbox.py) and its JavaScript.
sandbox:
	@test -x /usr/bin/bwrap -a -x /usr/bin/node -a -x /usr/bin/prlimit || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap nodejs util-linux >/dev/null)

# Debian's galera-4 and rsync: the three-node test cluster of .ci/galera (tests/galera.py).
galera:
	@bash .ci/galera install

services:
	@bash .ci/services

lint: install
	$(BIN)/ruff check agent api tests bench
	$(BIN)/ruff format --check agent api tests bench

# The whole suite: unit, API on SQLite and MariaDB, end-to-end, browser; then the speed check.
test: install browser sandbox galera services lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests
	$(MAKE) bench-check

# A short bench/http.py run (under a minute): fails only if ours/floor over HTTP is more
# than twice the ratio recorded in bench/http_baseline.json (a ratio, never a time).
bench-check: install
	$(BIN)/python bench/http.py --check

bench: install services
	$(BIN)/pip install -q -e '.[test,bench]'
	for b in bench/[!_]*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
