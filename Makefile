# Two commands do everything on a fresh machine (Python >= 3.10 with venv and pip):
#   make run    set up .venv and start the embedded default stack (4 emulated workers + router on :30000)
#   make test   set up .venv and .venv-sglang, run lint, type checks and the test suite (CI: .ci/run)
# and one for real SGLang workers on CPU:
#   make sglang  .venv-sglang: CPU torch 2.13.0, sglang 0.5.23 without CUDA deps, Mooncake, the
#                peers smg/sglang-router, the project's patches applied (idempotent)
# and one for the real coding agents the tests drive (make test runs it):
#   make agents  agents/node_modules: Claude Code, Codex and OpenCode, pinned (npm)
VENV ?= .venv
PY := $(VENV)/bin/python
SGL_VENV ?= .venv-sglang
SGL_PY := $(SGL_VENV)/bin/python
ARGS ?=

.PHONY: run test setup sglang agents flag-docs test-tools lint apt-base
setup: $(VENV)/.installed

# libibverbs1: what Mooncake's native client and mooncake_master (the `mooncake` extra) link
# against, in both environments.
apt-base:
	@dpkg -s libibverbs1 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libibverbs1; }

$(VENV)/.installed: pyproject.toml | apt-base
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,mooncake]'
	touch $@

run: setup
	$(PY) -m smetric_router.launch $(ARGS)

# docs/router-flags.md and docs/emulator-flags.md from the flags' declarations (after editing a
# flag; tests/test_flag_docs.py fails while they disagree with --help)
flag-docs: setup
	$(PY) -m smetric_router.core.flag_docs

sglang: $(SGL_VENV)/.installed
	$(SGL_PY) -m smetric_router.patches apply

# sglang and mooncake without their CUDA dependencies; the constraint keeps pip from swapping in a
# CUDA torch.
$(SGL_VENV)/.installed: sglang_env/requirements.txt sglang_env/constraints.txt pyproject.toml
	dpkg -s libibverbs1 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libibverbs1; }
	python3 -m venv $(SGL_VENV)
	$(SGL_PY) -m pip install -q --upgrade pip
	$(SGL_PY) -m pip install -q torch==2.13.0
	$(SGL_PY) -m pip install -q --no-deps sglang==0.5.23 mooncake-transfer-engine-non-cuda==0.3.13.post1
	$(SGL_PY) -m pip install -q -c sglang_env/constraints.txt -r sglang_env/requirements.txt
	$(SGL_PY) -m pip install -q --no-deps -e .
	touch $@

# The real coding-agent CLIs the tests run through the router (Claude Code, Codex, OpenCode),
# pinned in agents/package.json and its lock, from the npm registry (Node and npm on the machine).
agents: agents/node_modules/.installed

agents/node_modules/.installed: agents/package.json agents/package-lock.json
	cd agents && npm install --no-audit --no-fund --no-save
	touch $@

# Debian tools only the tests drive (command:package; one apt run for those missing):
# kubectl: its built-in Kustomize renders deploy/ for the manifest checks (tests/deploy); no
# cluster is needed or contacted.
# prometheus: promtool checks and unit-tests deploy/monitoring's rules, and a real Prometheus
# evaluates them and the Grafana dashboard's queries against a real router (tests/monitoring).
# chromium: headless, it opens the router's /dashboard page in tests/monitoring.
# haproxy: the router tier benchmark's load balancer, in front of router replicas
# (tests/benchmarks/test_router_tier.py).
# After apt-base: two apt runs at once would fight over dpkg's lock.
TEST_TOOLS := kubectl:kubectl promtool:prometheus chromium:chromium haproxy:haproxy
test-tools: apt-base
	@missing=; for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq $$missing; fi

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The environments, the agents and the Debian tools are made side by side, and lint runs while
# .venv-sglang installs; then the suite. compileall: where PYTHONDONTWRITEBYTECODE is set (as on
# these machines) nothing writes the project's bytecode, and each of the hundreds of processes the
# suite starts would compile its modules again.
# Two pytest processes: most tests wait on servers and emulated workers running in real time, so
# two keep the two cores busy; the real-SGLang tests stay in one (tests/helpers/groups.py).
TEST_PROCESSES ?= 2
test:
	$(MAKE) --no-print-directory -j4 --output-sync=target lint sglang agents test-tools
	$(PY) -m compileall -q smetric_router tests benchmarks
	SMETRIC_REQUIRE_SGLANG=1 SMETRIC_REQUIRE_SHARED=1 SMETRIC_REQUIRE_AGENTS=1 SMETRIC_REQUIRE_DEPLOY=1 \
		SMETRIC_REQUIRE_PROMETHEUS=1 SMETRIC_REQUIRE_CHROMIUM=1 $(PY) -m pytest -n $(TEST_PROCESSES)
